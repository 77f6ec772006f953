"""The team's secrets through the member API (``portal.secrets_api``): team admins set, list and
delete by name, never seeing a value back; members and finance get 403 naming the admins,
another team 404; names and values pass the Team page's own rules."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from nomadgpu import api_tokens
from nomadgpu.models import TeamSecret
from tests.support.factories import TeamSecretFactory

pytestmark = pytest.mark.django_db

HF_TOKEN = "hf_live_0123456789abcdefSECRET"
ROTATED = "hf_live_fedcba9876543210ROTATED"
URL = "/api/teams/team-a/secrets"


def bearer(user) -> dict[str, str]:
    _, token = api_tokens.create_token(user=user, name="test", now=timezone.now())
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def put(client, user, name: str, body: dict):
    return client.put(f"{URL}/{name}", body, content_type="application/json", **bearer(user))


def stored(team, name: str) -> str:
    return TeamSecret.objects.get(team=team, name=name).value


def test_an_admin_sets_replaces_lists_and_deletes_a_secret(client, cast):
    added = put(client, cast.admin, "HF_TOKEN", {"value": HF_TOKEN})
    replaced = put(client, cast.admin, "HF_TOKEN", {"value": ROTATED})
    listed = client.get(URL, **bearer(cast.admin))
    deleted = client.delete(f"{URL}/HF_TOKEN", **bearer(cast.admin))

    assert (added.status_code, added.json()["created"]) == (201, True)
    assert (replaced.status_code, replaced.json()["created"]) == (200, False)
    assert [row["name"] for row in listed.json()] == ["HF_TOKEN"]
    assert set(listed.json()[0]) == {"name", "created_at", "updated_at"}
    for response in (added, replaced, listed):
        assert HF_TOKEN not in response.content.decode()
        assert ROTATED not in response.content.decode()
        assert ROTATED[-4:] not in response.content.decode()
    assert deleted.status_code == 204
    assert not TeamSecret.objects.exists()


def test_the_value_is_sealed_at_rest(client, cast):
    put(client, cast.admin, "HF_TOKEN", {"value": HF_TOKEN})

    secret = TeamSecret.objects.get()
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM nomadgpu_teamsecret WHERE id = %s", [secret.pk])
        assert HF_TOKEN not in cursor.fetchone()[0]
    assert secret.value == HF_TOKEN


def test_post_to_the_list_sets_by_the_name_in_the_body(client, cast):
    response = client.post(
        URL,
        {"name": "WANDB_API_KEY", "value": "wandb-0123456789"},
        content_type="application/json",
        **bearer(cast.admin),
    )

    assert response.status_code == 201
    assert stored(cast.team_a, "WANDB_API_KEY") == "wandb-0123456789"


def test_a_multi_line_value_keeps_its_line_breaks(client, cast):
    pem = "-----BEGIN KEY-----\nAAAA\nBBBB\n-----END KEY-----\n"

    put(client, cast.admin, "DEPLOY_KEY", {"value": pem})

    assert stored(cast.team_a, "DEPLOY_KEY") == pem


@pytest.mark.parametrize("role", ["member", "finance"])
def test_members_and_finance_get_403_naming_the_admins(client, cast, role):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    user = getattr(cast, role)

    answers = [
        client.get(URL, **bearer(user)),
        put(client, user, "HF_TOKEN", {"value": ROTATED}),
        client.delete(f"{URL}/HF_TOKEN", **bearer(user)),
    ]

    for response in answers:
        assert response.status_code == 403
        assert response.json()["detail"] == (
            "only an admin of team Team A can list, set or delete its secrets: ask alice"
        )
    assert stored(cast.team_a, "HF_TOKEN") == HF_TOKEN


def test_another_team_is_404_and_untouched(client, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)

    answers = [
        client.get(URL, **bearer(cast.outsider)),
        put(client, cast.outsider, "HF_TOKEN", {"value": ROTATED}),
        client.delete(f"{URL}/HF_TOKEN", **bearer(cast.outsider)),
    ]

    assert [r.status_code for r in answers] == [404, 404, 404]
    assert stored(cast.team_a, "HF_TOKEN") == HF_TOKEN


def test_no_token_is_401(client, cast):
    assert client.get(URL).status_code == 401


@pytest.mark.parametrize(
    ("name", "body", "field", "message"),
    [
        ("1BAD", {"value": HF_TOKEN}, ["path", "name"], "environment variable name"),
        ("HAS-DASH", {"value": HF_TOKEN}, ["path", "name"], "environment variable name"),
        ("X" * 65, {"value": HF_TOKEN}, ["path", "name"], "at most 64 characters"),
        ("HF_TOKEN", {"value": "   "}, ["body", "payload", "value"], "A secret needs a value."),
        ("HF_TOKEN", {"value": "x" * 65537}, ["body", "payload", "value"], "At most 64 KiB."),
    ],
)
def test_names_and_values_follow_the_team_pages_rules(client, cast, name, body, field, message):
    response = put(client, cast.admin, name, body)

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == field
    assert message in error["msg"]
    assert not TeamSecret.objects.exists()


def test_a_value_too_short_to_mask_is_stored_with_a_note(client, cast):
    short = put(client, cast.admin, "PIN", {"value": "abc"})
    long = put(client, cast.admin, "TOKEN", {"value": "abcd"})

    assert short.status_code == 201
    assert short.json()["note"].startswith(
        "the value is shorter than 4 characters: it is stored, but not masked in logs"
    )
    assert long.json()["note"] == ""


def test_deleting_a_name_the_team_does_not_have_is_404(client, cast):
    response = client.delete(f"{URL}/NOPE", **bearer(cast.admin))

    assert response.status_code == 404
    assert response.json()["detail"] == "team team-a has no secret named 'NOPE'"


def test_my_teams_lists_each_team_with_my_role(client, cast):
    response = client.get("/api/teams/", **bearer(cast.admin))

    assert response.json() == [{"slug": "team-a", "name": "Team A", "role": "admin"}]


def test_the_openapi_schema_lists_the_secret_endpoints(client):
    paths = client.get("/api/openapi.json").json()["paths"]

    assert set(paths["/api/teams/{slug}/secrets"]) == {"get", "post"}
    assert set(paths["/api/teams/{slug}/secrets/{name}"]) == {"put", "delete"}
