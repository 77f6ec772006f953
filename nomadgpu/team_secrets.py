"""A team's secrets (``TeamSecret``): set, replaced, deleted, looked up by name, and masked.

A value goes in through the admin, the Team page or the member API (``nomadgpu secret set``)
and comes out in exactly two places: the register reply of an agent whose job names it
(``jobs.code.job_secrets``), and, for the secret a job names as its ``image_login_secret``,
Vast's create request (``image_login``). Everything else sees names only. ``mask`` is the
server's defence in depth for text an agent sends back (the agent masks first, PROTOCOL.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core.exceptions import ValidationError

from nomadgpu.models import Team, TeamSecret

# A deploy key's PEM is ~3 kB and a registry login a line; this only stops a pasted file.
VALUE_MAX_CHARS = 64 * 1024
# Shorter values would mask ordinary words and digits in the log (the agent's rule too).
MASK_MIN_CHARS = 4
MASK = "***"


def missing_refusal(name: str) -> str:
    """The sentence a submit naming secret NAME gets when the team has none of that name."""
    return f"the team has no secret named {name!r}: add it on the Team page or in the admin"


def names_of(team: Team | int) -> list[str]:
    """TEAM's secret names, sorted (no value is read: nothing is decrypted)."""
    return list(
        TeamSecret.objects.filter(team=team).order_by("name").values_list("name", flat=True)
    )


def missing_names(team: Team | int, names: Iterable[str]) -> list[str]:
    """Those of NAMES (in their order) that TEAM has no secret for."""
    wanted = [n for n in names if n]
    have = set(TeamSecret.objects.filter(team=team, name__in=wanted).values_list("name", flat=True))
    return [n for n in wanted if n not in have]


def values_for(team: Team | int, names: Iterable[str]) -> dict[str, str]:
    """The opened values of TEAM's secrets among NAMES, by name (one query; a name the team
    no longer has is left out). Each is a ``SecretStr``: a plain str to code and to JSON,
    masked in repr() should one land in a traceback or a log line."""
    wanted = {n for n in names if n}
    if not wanted:
        return {}
    rows = TeamSecret.objects.filter(team=team, name__in=wanted).only("name", "value")
    return {row.name: row.value for row in rows}


def mask(text: str, values: Iterable[str]) -> str:
    """TEXT with every value of VALUES at least ``MASK_MIN_CHARS`` long replaced by ``***``.
    Longest first, so a value that contains another is masked whole."""
    for value in sorted({v for v in values if len(v) >= MASK_MIN_CHARS}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def mask_note(value: str) -> str:
    """What a person setting VALUE should know about its masking: "" for a value that will be
    masked, else why a shorter one will not be."""
    if len(value) >= MASK_MIN_CHARS:
        return ""
    return (
        f"the value is shorter than {MASK_MIN_CHARS} characters: it is stored, but not masked "
        "in logs (masking so short a value would hide ordinary words and numbers)"
    )


def set_secret(*, team: Team, name: str, value: str) -> TeamSecret:
    """Add TEAM's secret NAME, or replace its value. Raises ``ValidationError`` for a name that
    is not an environment variable name or an empty or oversized value."""
    secret = TeamSecret.objects.filter(team=team, name=name).first() or TeamSecret(
        team=team, name=name
    )
    secret.value = value
    _check_value(value)
    secret.full_clean(exclude=["team", "value"], validate_unique=False)
    secret.save()
    return secret


def delete_secret(*, team: Team, name: str) -> bool:
    """Delete TEAM's secret NAME; False when there was none."""
    deleted, _ = TeamSecret.objects.filter(team=team, name=name).delete()
    return deleted > 0


def _check_value(value: str) -> None:
    if not value:
        raise ValidationError({"value": "A secret needs a value."})
    if len(value) > VALUE_MAX_CHARS:
        raise ValidationError(
            {"value": f"A secret is at most {VALUE_MAX_CHARS // 1024} KiB ({len(value)} chars)."}
        )
