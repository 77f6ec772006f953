"""Team secrets are sealed at rest, masked in admin, and a bad key stops the processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection
from django.urls import reverse

from nomadgpu import crypto
from nomadgpu.models import Team
from tests.support.factories import TeamFactory
from tests.support.processes import ROOT, subprocess_env

VAST_KEY = "vast-live-0123456789abcdef"
OTHER_KEY = crypto.generate_key()


def stored_column(team: Team, column: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM nomadgpu_team WHERE id = %s", [team.id])  # noqa: S608
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_the_stored_column_is_not_the_plaintext():
    team = TeamFactory(vast_api_key=VAST_KEY)

    raw = stored_column(team, "vast_api_key")

    assert VAST_KEY not in raw
    assert raw.startswith("v1:")
    assert Team.objects.get(pk=team.pk).vast_api_key == VAST_KEY


@pytest.mark.django_db
def test_a_sealed_value_does_not_open_in_another_column():
    team = TeamFactory(vast_api_key=VAST_KEY)
    raw = stored_column(team, "vast_api_key")

    with pytest.raises(crypto.SecretUnreadable):
        crypto.open_sealed(raw, context="nomadgpu.team.telegram_bot_token")


def test_repr_of_a_secret_hides_it():
    from nomadgpu.fields import SecretStr

    assert VAST_KEY not in repr(SecretStr(VAST_KEY))
    assert repr(SecretStr(VAST_KEY)).endswith("cdef'")


@pytest.mark.django_db
def test_admin_shows_secrets_masked_and_keeps_them_when_left_blank(client, cast):
    cast.team_a.vast_api_key = VAST_KEY
    cast.team_a.save()
    client.force_login(cast.admin)
    url = reverse("admin:nomadgpu_team_change", args=[cast.team_a.id])

    page = client.get(url).content.decode()
    assert VAST_KEY not in page
    assert "••••••••cdef" in page

    form = {
        "name": "Team A renamed",
        "slug": "team-a",
        "time_zone": "Europe/Berlin",
        "reference_name": "A100",
        "reference_rate_usd_per_hour": "4.10",
        "reference_speed_factor": "1.0",
        "vast_api_key": "",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    cast.team_a.refresh_from_db()
    assert cast.team_a.name == "Team A renamed"
    assert cast.team_a.vast_api_key == VAST_KEY


def run_startup(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db
def test_a_missing_key_fails_at_startup_saying_what_to_set():
    result = run_startup(["manage.py", "check"], FIELD_ENCRYPTION_KEY="")

    assert result.returncode != 0
    assert "Set FIELD_ENCRYPTION_KEY" in result.stderr


@pytest.mark.django_db
def test_a_malformed_key_fails_at_startup():
    result = run_startup(["manage.py", "check"], FIELD_ENCRYPTION_KEY="tooshort")

    assert result.returncode != 0
    assert "FIELD_ENCRYPTION_KEY" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_wrong_key_fails_at_startup_of_web_and_checks():
    TeamFactory(vast_api_key=VAST_KEY)

    check = run_startup(["manage.py", "check"], FIELD_ENCRYPTION_KEY=OTHER_KEY)
    wsgi = run_startup(["-c", "import nomadgpu.wsgi"], FIELD_ENCRYPTION_KEY=OTHER_KEY)

    assert check.returncode != 0
    assert "cannot be opened" in check.stderr
    assert wsgi.returncode == 2
    assert "NomadGPU cannot start" in wsgi.stderr


@pytest.mark.django_db(transaction=True)
def test_a_rotated_key_list_still_opens_old_secrets():
    TeamFactory(vast_api_key=VAST_KEY)
    current = subprocess_env()["FIELD_ENCRYPTION_KEY"]

    result = run_startup(["manage.py", "check"], FIELD_ENCRYPTION_KEY=f"{OTHER_KEY},{current}")

    assert result.returncode == 0, result.stderr
