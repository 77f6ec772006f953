"""A submit a spending limit refuses says what can be done (``billing.next_steps``): wait for
the period to roll over (when, in the team's time zone), ask an admin (by name), or submit
with "Wait for budget"; the same sentence on the portal form and in the member API's 409 (the
CLI prints the API's: tests/test_cli.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from billing.models import TeamBudget
from jobs.models import Job
from nomadgpu import api_tokens
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 11, 4, 12, tzinfo=UTC)  # a Wednesday
# 900 steps of 4 s on the reference RTX 4090 at $0.40/h: about $0.41 before any run is measured.
SPEC = {
    "name": "ft",
    "image": "pytorch/pytorch:2.4.0",
    "command": "python t.py",
    "total_steps": 900,
    "requirements": {"gpu_names": ["RTX 4090"], "disk_gb": 20},
    "profile": {"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.0},
}
WAIT = (
    'or submit with "Wait for budget" (the form\'s checkbox, or start_when_budget_allows = '
    "true in a job file or the API) to queue the job until it fits."
)


def spent_today(team, usd: float, *, by) -> None:
    """A job that ran for the half hour before noon at twice USD an hour."""
    since = NOON - timedelta(minutes=30)
    job = JobFactory(team=team, state="running", created_at=since, created_by=by)
    make_attempt(job, state="running", dph_base=usd * 2, rented_at=since, registered_at=since)


def limits(team, **values) -> None:
    TeamBudget.objects.create(team=team, **{k: Decimal(v) for k, v in values.items()})


def submit(client, user, **extra):
    _, token = api_tokens.create_token(user=user, name="t", now=timezone.now())
    with time_machine.travel(NOON, tick=False):
        return client.post(
            "/api/jobs/",
            {**SPEC, **extra},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )


def test_the_api_refusal_names_the_rollover_the_admins_and_the_wait(client, cast):
    limits(cast.team_a, daily_usd="1.00")
    spent_today(cast.team_a, 0.72, by=cast.admin)

    response = submit(client, cast.member)

    assert response.status_code == 409
    detail = response.json()["detail"]
    assert re.fullmatch(
        r"Refused: estimated cost \$0\.\d+ would cross the daily limit \$1\.00: \$0\.720 "
        r"spent\. What you can do: wait until the daily limit starts again at 00:00 on Thu 5 "
        r"Nov \(UTC\), in 12 h; ask a team admin \(alice\) to raise it; " + re.escape(WAIT),
        detail,
    ), detail
    assert not Job.objects.filter(name="ft").exists()


def test_the_rollover_is_said_in_the_teams_time_zone(client, cast):
    cast.team_a.time_zone = "America/New_York"
    cast.team_a.save()
    limits(cast.team_a, weekly_usd="1.00")
    spent_today(cast.team_a, 0.72, by=cast.admin)

    detail = submit(client, cast.member).json()["detail"]

    # Monday 9 Nov 00:00 in New York is 05:00 UTC: 4 days and 17 h after Wednesday noon UTC.
    assert "wait until the weekly limit starts again at 00:00 on Mon 9 Nov " in detail
    assert "(America/New_York), in 4 days;" in detail


def test_a_member_limit_rolls_over_with_the_month(client, cast):
    limits(cast.team_a, member_monthly_usd="1.00")
    spent_today(cast.team_a, 0.72, by=cast.member)

    detail = submit(client, cast.member).json()["detail"]

    assert "would cross the per-member monthly limit $1.00: $0.720 spent" in detail
    assert "starts again at 00:00 on Tue 1 Dec (UTC), in 26 days; ask a team admin" in detail


def test_an_estimate_larger_than_the_whole_limit_is_not_told_to_wait(client, cast):
    limits(cast.team_a, daily_usd="0.100")

    detail = submit(client, cast.member).json()["detail"]

    assert detail.endswith(
        "The estimate alone is more than the whole daily limit $0.100, so waiting does not "
        "help. What you can do: ask a team admin (alice) to raise it, or make the job smaller."
    )
    assert "Wait for budget" not in detail


def test_the_jobs_own_limit_is_the_submitters_to_change(client, cast):
    detail = submit(client, cast.member, budget_usd="0.010").json()["detail"]

    assert "would cross the job limit $0.0100" in detail
    assert detail.endswith(
        'What you can do: give the job a larger limit of its own ("Budget (USD)" on the form, '
        "budget_usd in a job file or the API), or none: the team's limits still apply."
    )


def test_the_form_shows_the_same_ways_out(client, cast):
    limits(cast.team_a, daily_usd="1.00")
    spent_today(cast.team_a, 0.72, by=cast.admin)
    client.force_login(cast.member)

    with time_machine.travel(NOON, tick=False):
        response = client.post(reverse("job-new"), {**spec_to_initial(SPEC), "team": "team-a"})

    assert response.status_code == 200
    [error] = response.context["form"].non_field_errors()
    assert "What you can do: wait until the daily limit starts again at 00:00 on Thu 5 Nov" in error
    assert "ask a team admin (alice) to raise it; " + WAIT in error
    assert not Job.objects.filter(name="ft").exists()


def test_waiting_for_budget_is_what_the_refusal_says_it_is(client, cast):
    limits(cast.team_a, daily_usd="1.00")
    spent_today(cast.team_a, 0.72, by=cast.admin)

    response = submit(client, cast.member, start_when_budget_allows=True)

    assert response.status_code == 201
    assert Job.objects.get(name="ft").state == "queued"
