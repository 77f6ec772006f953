"""The numbers the portal shows, computed without a server: ETA, projections, month spend,
chart geometry and the spend-over-time series."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from portal import figures as portal
from tests.support.factories import JobFactory, make_attempt

NOW = datetime(2026, 3, 1, 0, 30, tzinfo=UTC)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "step", "seconds_per_step", "eta_s", "percent"),
    [
        ("running", 100, 4.0, 800, pytest.approx(100 / 3)),
        ("running", 100, None, None, pytest.approx(100 / 3)),
        ("starting", None, 4.0, None, None),
        ("recovering", 100, 4.0, None, pytest.approx(100 / 3)),  # no ETA without a host
    ],
)
def test_eta_is_remaining_steps_times_seconds_per_step_while_training(
    state, step, seconds_per_step, eta_s, percent
):
    job = JobFactory(total_steps=300)
    make_attempt(job, state="running", step=step, seconds_per_step=seconds_per_step)
    job.state = state
    job.save(update_fields=["state"])

    row = portal.job_row(
        portal.with_portal_data(job.__class__.objects.filter(pk=job.pk)).get(), now=NOW
    )

    assert row.progress.eta_s == eta_s
    assert row.progress.percent == percent


@pytest.mark.django_db
def test_month_spend_starts_at_midnight_in_the_teams_time_zone_and_clips_attempts():
    # 00:30 UTC on 1 March is still February in New York (UTC-5): the month began on
    # 1 February 05:00 UTC, so an attempt running since 31 January 23:00 UTC counts from then.
    job = JobFactory(team__time_zone="America/New_York")
    make_attempt(
        job,
        state="running",
        dph_base=1.0,
        rented_at=datetime(2026, 1, 31, 23, 0, tzinfo=UTC),
        registered_at=datetime(2026, 1, 31, 23, 0, tzinfo=UTC),
    )

    spent = portal.team_month_spend(job.team, now=NOW)

    hours = (NOW - datetime(2026, 2, 1, 5, 0, tzinfo=UTC)).total_seconds() / 3600
    assert spent == pytest.approx(hours * 1.0)


def test_line_chart_maps_the_range_into_the_box_with_y_up():
    chart = portal.line_chart([(0, 0.0), (10, 1.0)], width=100, height=50)

    assert chart.points == "6.0,44.0 94.0,6.0"
    assert (chart.y_min, chart.y_max) == (0.0, 1.0)


def test_a_single_point_is_no_chart():
    assert portal.line_chart([(0, 1.0)]) is None


@pytest.mark.django_db
def test_spend_series_picks_a_readable_time_unit():
    job = JobFactory(created_at=NOW - timedelta(hours=2))
    make_attempt(
        job,
        state="running",
        dph_base=0.5,
        rented_at=NOW - timedelta(hours=2),
        registered_at=NOW - timedelta(hours=2),
    )

    series, unit = portal.spend_series(job, now=NOW, points=5)

    assert unit == "min"
    assert series[0] == (0.0, 0.0)
    assert series[-1][0] == pytest.approx(120.0)
    assert series[-1][1] == pytest.approx(1.0)
