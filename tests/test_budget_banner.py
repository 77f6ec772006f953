"""The spending-limit banner shows each limit's share now, updates by polling its htmx
fragment, and clears when the limit is raised or its period rolls over (``billing.banner``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.urls import reverse

from billing.models import TeamBudget
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 11, 4, 12, tzinfo=UTC)
HX = {"HTTP_HX_REQUEST": "true"}


def burning(team, *, since: datetime, budget_usd=None):
    """A job training on a $0.36/h GPU since SINCE (no storage, no traffic): $0.0001 a second."""
    job = JobFactory(team=team, state="running", created_at=since, budget_usd=budget_usd)
    make_attempt(job, state="running", dph_base=0.36, rented_at=since, registered_at=since)
    return job


def daily_limit(team, usd: str) -> None:
    TeamBudget.objects.update_or_create(team=team, defaults={"daily_usd": Decimal(usd)})


def fragment(client, team, at: datetime) -> str:
    with time_machine.travel(at, tick=False):
        response = client.get(reverse("budget-banner", args=[team.slug]), **HX)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def team_near_its_daily_limit(client, cast):
    daily_limit(cast.team_a, "0.080")
    burning(cast.team_a, since=NOON - timedelta(seconds=792))  # $0.0792 by noon: 99 %
    client.force_login(cast.member)
    return cast.team_a


def test_the_banner_shows_the_share_of_the_limit_now_and_polls_its_fragment(
    client, team_near_its_daily_limit
):
    with time_machine.travel(NOON, tick=False):
        page = client.get(reverse("dashboard")).content.decode()

    assert "Daily limit $0.0800: 99 % used ($0.0792)" in page  # not "80 % reached"
    url = reverse("budget-banner", args=[team_near_its_daily_limit.slug])
    assert f'hx-get="{url}" hx-trigger="every 10s" hx-swap="outerHTML"' in page


def test_the_fragment_follows_the_spend_between_polls(client, team_near_its_daily_limit):
    earlier = fragment(client, team_near_its_daily_limit, NOON - timedelta(seconds=144))
    now = fragment(client, team_near_its_daily_limit, NOON)

    assert "Daily limit $0.0800: 81 % used ($0.0648)" in earlier
    assert "Daily limit $0.0800: 99 % used ($0.0792)" in now


def test_the_banner_clears_when_the_limit_is_raised_and_keeps_polling(
    client, team_near_its_daily_limit
):
    daily_limit(team_near_its_daily_limit, "1.00")

    raised = fragment(client, team_near_its_daily_limit, NOON)

    assert "<li>" not in raised
    assert 'id="budget-banner"' in raised  # still polled: back if it fills again
    assert "hx-get=" in raised


def test_the_banner_clears_when_the_period_rolls_over(client, team_near_its_daily_limit):
    # The job still runs: five minutes of tomorrow are $0.0300 of tomorrow's $0.0800.
    tomorrow = datetime(2026, 11, 5, 0, 5, tzinfo=UTC)

    assert "<li>" not in fragment(client, team_near_its_daily_limit, tomorrow)


def test_a_jobs_own_limit_shows_with_its_name(client, cast):
    burning(cast.team_a, since=NOON - timedelta(seconds=82), budget_usd=Decimal("0.010"))
    client.force_login(cast.member)

    banner = fragment(client, cast.team_a, NOON)

    assert "Job limit $0.0100 of job " in banner
    assert ": 82 % used ($0.00820)" in banner


def test_an_outsider_gets_no_fragment_and_a_team_without_limits_is_not_polled(client, cast):
    burning(cast.team_a, since=NOON - timedelta(hours=1))
    client.force_login(cast.outsider)
    outsider = client.get(reverse("budget-banner", args=[cast.team_a.slug]), **HX)
    client.force_login(cast.member)
    with time_machine.travel(NOON, tick=False):
        page = client.get(reverse("dashboard")).content.decode()

    assert outsider.status_code == 404
    assert "budget-banner" not in page
