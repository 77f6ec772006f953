"""The numbers the portal shows, computed without a server: ETA, projections, month spend,
chart geometry and the spend-over-time series."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from billing.cost import INVOICED, RECORDED, job_cost
from billing.models import InvoiceSync
from portal import figures as portal
from tests.support.charges import bill
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
    assert (spent.amount, spent.basis) == (pytest.approx(hours * 1.0), RECORDED)


@pytest.mark.django_db
def test_month_spend_counts_an_invoiced_attempt_at_its_charges_like_the_jobs_cost():
    job, _ = invoiced_job()
    february = NOW - timedelta(minutes=31)  # the job ran on 28 February

    month = portal.team_month_spend(job.team, now=february)

    assert (month.text, month.basis) == (job_cost(job, now=february).text, INVOICED)
    assert month.text == "$0.300"  # Vast's bill, not the $0.400 recorded


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

    series, unit = portal.spend_series(job, now=NOW, cost=job_cost(job, now=NOW), points=5)

    assert unit == "min"
    assert series[0] == (0.0, 0.0)
    assert series[-1][0] == pytest.approx(120.0)
    assert series[-1][1] == pytest.approx(1.0)


def invoiced_job():
    """A job whose one hour of GPU NomadGPU recorded at $0.40 and Vast billed at $0.30, the
    import covering it."""
    start = NOW - timedelta(hours=2)
    job = JobFactory(created_at=start)
    attempt, _ = make_attempt(
        job,
        state="ended",
        instance_id=501,
        dph_base=0.4,
        rented_at=start,
        registered_at=start,
        ended_at=start + timedelta(hours=1),
    )
    bill(attempt, ("gpu", "1.000 hours at $0.300/hour", "0.300"), day=start.date())
    InvoiceSync.objects.create(team=job.team, synced_until=NOW)
    return job, attempt


@pytest.mark.django_db
def test_the_spend_chart_ends_at_the_jobs_cost_once_invoiced():
    job, _ = invoiced_job()
    cost = job_cost(job, now=NOW)

    series, _ = portal.spend_series(job, now=NOW, cost=cost, points=5)

    dollars = [d for _, d in series]
    assert dollars[-1] == float(cost.total) == pytest.approx(0.30)  # not the $0.40 recorded
    assert dollars == sorted(dollars)  # grows with the time the GPU ran
    assert dollars[2] == pytest.approx(0.30)  # an hour in, the attempt had ended
    assert dollars[1] == pytest.approx(0.15)  # half an hour in: half its bill
