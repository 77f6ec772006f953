"""A team's secrets through the member API (``/api/teams/...``): what the Team page's form does
(``portal.team_secrets``), for ``nomadgpu secret`` and scripts.

    GET    /api/teams/                        your teams: slug, name, your role
    GET    /api/teams/{slug}/secrets          names and when each was last set, never a value
    POST   /api/teams/{slug}/secrets          {"name": ..., "value": ...}: add or replace
    PUT    /api/teams/{slug}/secrets/{name}   {"value": ...}: add or replace
    DELETE /api/teams/{slug}/secrets/{name}   204; 404 when the team has no such secret

Team admins only: another team is 404 (as everywhere in the member API), a member or finance
of the team gets 403 with a sentence naming the team's admins. A name and a value pass the
Team page's own form (``TeamSecretForm``: an environment variable name of at most 64
characters, a value that is not blank and at most 64 KiB), its errors a 422 on the field.
A value is never in an answer. The masking downstream is the same as for a value set on the
page: the agent and the server mask values of 4 characters or more (``MASK_MIN_CHARS``), so a
shorter one is stored but not masked in logs, and the answer says so (``note``).
"""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import ValidationError
from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import django_auth

from nomadgpu import team_secrets
from nomadgpu.models import Membership, Team, TeamSecret
from nomadgpu.permissions import can_manage_team, get_team_for_member_or_404
from nomadgpu.team_admins import admin_names
from portal.member_api import PersonalToken
from portal.team_secrets import TeamSecretForm

router = Router(auth=[PersonalToken(), django_auth], tags=["teams"])

# A JSON body is read whole; the form refuses a value over 64 KiB with its own sentence.
BODY_VALUE_MAX = 2 * team_secrets.VALUE_MAX_CHARS


class TeamOut(Schema):
    slug: str
    name: str
    role: str = Field(description="your role in the team: member, finance or admin")


class SecretOut(Schema):
    name: str
    created_at: datetime
    updated_at: datetime = Field(description="when the value was last set")


class SecretIn(Schema):
    name: str = Field(max_length=200, description="an environment variable name, e.g. HF_TOKEN")
    value: str = Field(max_length=BODY_VALUE_MAX, description="never shown again")


class SecretValueIn(Schema):
    value: str = Field(max_length=BODY_VALUE_MAX, description="never shown again")


class SecretSetOut(SecretOut):
    created: bool = Field(description="true: a new name; false: the value of a name replaced")
    note: str = Field(description='"" or why the value will not be masked in logs')


def managed_team(request: HttpRequest, slug: str) -> Team:
    """Team SLUG if the caller administers it: 404 for another team, 403 for its others."""
    team = get_team_for_member_or_404(request.auth, slug)
    if not can_manage_team(request.auth, team):
        raise HttpError(
            403,
            f"only an admin of team {team.name} can list, set or delete its secrets: "
            f"ask {admin_names(team)}",
        )
    return team


def checked(name: str, value: str, *, name_loc: list[str]) -> tuple[str, str]:
    """NAME and VALUE as the Team page's form accepts them, else a 422 on each field at fault."""
    form = TeamSecretForm(data={"name": name, "value": value})
    if form.is_valid():
        return form.cleaned_data["name"], form.cleaned_data["value"]
    locs = {"name": name_loc, "value": ["body", "payload", "value"]}
    raise NinjaValidationError(
        [
            {"loc": locs.get(field, ["body", "payload"]), "msg": str(msg), "type": "secret"}
            for field, msgs in form.errors.items()
            for msg in msgs
        ]
    )


def store(team: Team, name: str, value: str) -> dict:
    created = not TeamSecret.objects.filter(team=team, name=name).exists()
    try:
        secret = team_secrets.set_secret(team=team, name=name, value=value)
    except ValidationError as exc:
        raise NinjaValidationError(
            [{"loc": ["body", "payload"], "msg": m, "type": "secret"} for m in exc.messages]
        ) from exc
    return {
        "name": secret.name,
        "created_at": secret.created_at,
        "updated_at": secret.updated_at,
        "created": created,
        "note": team_secrets.mask_note(value),
    }


@router.get("/", response=list[TeamOut])
def my_teams(request: HttpRequest):
    """The teams you belong to, and your role in each."""
    rows = Membership.objects.filter(user=request.auth).select_related("team")
    return [
        {"slug": m.team.slug, "name": m.team.name, "role": m.role}
        for m in rows.order_by("team__slug")
    ]


@router.get("/{slug}/secrets", response=list[SecretOut])
def list_secrets(request: HttpRequest, slug: str):
    """The team's secret names and when each was last set (team admins); never a value."""
    team = managed_team(request, slug)
    return list(TeamSecret.objects.filter(team=team).defer("value").order_by("name"))


@router.post("/{slug}/secrets", response={200: SecretSetOut, 201: SecretSetOut})
def add_secret(request: HttpRequest, slug: str, payload: SecretIn):
    """Add a secret, or replace the value of one the team has (team admins)."""
    team = managed_team(request, slug)
    name, value = checked(payload.name, payload.value, name_loc=["body", "payload", "name"])
    out = store(team, name, value)
    return Status(201 if out["created"] else 200, out)


@router.put("/{slug}/secrets/{name}", response={200: SecretSetOut, 201: SecretSetOut})
def set_secret(request: HttpRequest, slug: str, name: str, payload: SecretValueIn):
    """Set secret NAME to the body's value: added, or its value replaced (team admins)."""
    team = managed_team(request, slug)
    name, value = checked(name, payload.value, name_loc=["path", "name"])
    out = store(team, name, value)
    return Status(201 if out["created"] else 200, out)


@router.delete("/{slug}/secrets/{name}", response={204: None})
def delete_secret(request: HttpRequest, slug: str, name: str):
    """Delete secret NAME (team admins): a job naming it no longer gets it."""
    team = managed_team(request, slug)
    if not team_secrets.delete_secret(team=team, name=name):
        raise HttpError(404, f"team {team.slug} has no secret named {name!r}")
    return Status(204, None)
