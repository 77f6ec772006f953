"""A job's cost while the invoice covers some of its attempts (``billing.cost``): "partly
invoiced", with both parts, the recorded part never below what was recorded; and how finance
writes a difference whose percentage would mean nothing (``billing.templatetags.finance``)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.cost import INVOICED, PARTLY_INVOICED, RECORDED, cost_of, job_cost
from billing.spend import attempt_spend
from billing.templatetags.finance import NOT_BILLED_YET, difference_text
from tests.support.charges import bill
from tests.support.factories import InvoiceSyncFactory, JobFactory, make_attempt

NOW = timezone.now().replace(microsecond=0)
START = NOW - timedelta(hours=2)


def lost_then_running(team=None):
    """Attempt 1 ran 30 min at $0.40/h and was lost; attempt 2 has run 40 min at $0.30/h."""
    job = JobFactory(**({"team": team} if team else {}), created_at=START)
    first, _ = make_attempt(
        job,
        state="ended",
        instance_id=801,
        dph_base=0.40,
        rented_at=START,
        registered_at=START,
        ended_at=START + timedelta(minutes=30),
    )
    second, _ = make_attempt(
        job,
        number=2,
        state="running",
        instance_id=802,
        dph_base=0.30,
        rented_at=NOW - timedelta(minutes=40),
        registered_at=NOW - timedelta(minutes=40),
    )
    return job, first, second


@pytest.mark.django_db
def test_a_job_with_one_attempt_billed_and_one_live_is_partly_invoiced_with_both_parts():
    job, first, _ = lost_then_running()
    recorded_before = job_cost(job, now=NOW)
    bill(first, ("gpu", "0.500 hours at $0.350/hour", "0.175"), day=START.date())
    InvoiceSyncFactory(team=job.team, synced_until=NOW - timedelta(minutes=5))

    cost = job_cost(job, now=NOW)

    assert recorded_before.basis == RECORDED
    assert recorded_before.text == "$0.400"  # $0.200 + $0.200 recorded
    assert cost.basis == PARTLY_INVOICED
    assert (cost.invoiced_usd, cost.recorded_usd) == (Decimal("0.175"), Decimal("0.2"))
    assert cost.text == "$0.375"
    assert cost.split == "$0.175 invoiced + $0.200 recorded"
    assert cost.described == "$0.375 (partly invoiced: $0.175 invoiced + $0.200 recorded)"
    assert (cost.invoiced, cost.partly_invoiced) == (False, True)


@pytest.mark.django_db
def test_the_recorded_part_is_what_was_recorded_for_those_attempts_before_the_import():
    job, first, second = lost_then_running()
    before = float(attempt_spend(second, now=NOW).total)
    bill(first, ("gpu", "0.500 hours at $0.350/hour", "0.175"), day=START.date())
    InvoiceSyncFactory(team=job.team, synced_until=NOW)

    assert float(job_cost(job, now=NOW).recorded_usd) == pytest.approx(before)


@pytest.mark.django_db
def test_an_attempt_that_ended_after_the_imports_reach_is_still_recorded():
    job, first, _ = lost_then_running()
    bill(first, ("gpu", "0.500 hours at $0.350/hour", "0.175"), day=START.date())

    early = cost_of(job.attempts.all(), now=NOW, covered=START + timedelta(minutes=10))

    assert (early.basis, early.text) == (RECORDED, "$0.400")


@pytest.mark.django_db
def test_once_every_attempt_ended_before_the_import_the_job_is_invoiced():
    job, first, second = lost_then_running()
    second.state, second.ended_at = "ended", NOW - timedelta(minutes=10)
    second.save()
    bill(first, ("gpu", "0.500 hours at $0.350/hour", "0.175"), day=START.date())
    bill(second, ("gpu", "0.500 hours at $0.300/hour", "0.150"), day=NOW.date())
    InvoiceSyncFactory(team=job.team, synced_until=NOW)

    cost = job_cost(job, now=NOW)

    assert (cost.basis, cost.text, cost.split) == (INVOICED, "$0.325", "")
    assert cost.described == "$0.325 (invoiced)"


@pytest.mark.parametrize(
    ("recorded", "billed", "pending", "text"),
    [
        (0.0281, 0.0, 1, NOT_BILLED_YET),  # live: not "-100.0 %"
        (0.0281, 0.0130, 1, "-$0.0151 (— %, 1 attempt not billed yet)"),
        (0.0000004, 0.0, 0, "$0.00 (— %, nothing recorded)"),  # not "$0.00 / $0.00 (-100.0 %)"
        (0.0, 0.0130, 0, "+$0.0130 (— %, nothing recorded)"),
        (0.0281, 0.0130, 0, "-$0.0151 (-53.7 %)"),  # of the amounts as written
        (0.0200, 0.0200, 0, "$0.00 (+0.0 %)"),
    ],
)
def test_finance_shows_a_percentage_only_of_an_amount_recorded_and_billed(
    recorded, billed, pending, text
):
    assert difference_text(recorded, billed, pending=pending) == text


@pytest.mark.django_db
def test_the_finance_page_writes_a_live_job_not_billed_yet_and_its_cost_partly_invoiced(
    client, cast
):
    job, first, _ = lost_then_running(team=cast.team_a)
    bill(first, ("gpu", "0.500 hours at $0.350/hour", "0.175"), day=START.date())
    InvoiceSyncFactory(team=cast.team_a, synced_until=NOW)
    client.force_login(cast.finance)

    page = client.get(f"/finance/team-a/?start={START.date()}&end={NOW.date()}")
    detail = client.get(f"/finance/team-a/jobs/{job.pk}/").content.decode()

    body = page.content.decode()
    assert "(— %, 1 attempt not billed yet)" in body
    assert "-100.0 %" not in body
    assert 'partly invoiced</span> <span class="muted small">(' in body
    assert "$0.175 invoiced + " in body
    assert "not billed yet" in detail  # attempt 2's components
    assert "-100.0 %" not in detail


@pytest.mark.django_db
def test_the_job_pages_budget_share_is_the_recorded_spend_the_limit_counts(client, cast):
    job = JobFactory(team=cast.team_a, created_at=START, budget_usd=Decimal("0.500"))
    attempt, _ = make_attempt(
        job,
        state="ended",
        instance_id=803,
        dph_base=0.40,
        rented_at=START,
        registered_at=START,
        ended_at=START + timedelta(hours=1),
    )
    bill(attempt, ("gpu", "1.000 hours at $0.300/hour", "0.300"), day=START.date())
    InvoiceSyncFactory(team=cast.team_a, synced_until=NOW)
    client.force_login(cast.member)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="job-cost">$0.300<' in page  # the invoice
    assert "80 % used as recorded, which the limit counts" in page  # $0.400 of $0.500
