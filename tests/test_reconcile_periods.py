"""Reconciliation per period: a systematic overcharge spread over many attempts, each under
the per-attempt floor, is flagged at the team-day and team-month level with its total and the
count of attempts; once per period, however often the import runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing import reconcile
from billing.models import DiscrepancyFlag, FlagStatus, InvoiceSync
from nomadgpu.humanize import money
from tests.support.charges import bill
from tests.support.factories import InvoiceSyncFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 3, 10, tzinfo=UTC)
NOW = T0 + timedelta(days=2)
RUN = timedelta(minutes=9)  # 0.15 h at $0.40/h: $0.060 recorded


def attempts_billed(team, n: int, *, billed: str, at=T0, first_instance: int = 9000) -> list:
    """N ended runs of $0.060 recorded each, rented at AT, each billed BILLED dollars."""
    made = []
    hours = Decimal(billed) / Decimal("0.4")
    for k in range(n):
        job = JobFactory(team=team, name=f"sweep-{first_instance + k}")
        attempt, _ = make_attempt(
            job,
            state="ended",
            instance_id=first_instance + k,
            rented_at=at + timedelta(seconds=k),
            registered_at=at + timedelta(seconds=k),
            ended_at=at + timedelta(seconds=k) + RUN,
            dph_base=0.40,
            storage_usd_per_gb_hour=0.0,
        )
        bill(attempt, ("gpu", f"{hours:.4f} hours at $0.400/hour", billed), day=at.date())
        made.append(attempt)
    return made


@pytest.fixture
def team(cast):
    InvoiceSyncFactory(team=cast.team_a, synced_until=NOW - timedelta(hours=1))
    return cast.team_a


def period_flags(team):
    return {
        (f.period, f.period_start): f
        for f in DiscrepancyFlag.objects.filter(team=team, period_start__isnull=False)
    }


def test_forty_attempts_each_15_percent_over_are_flagged_by_day_and_month_with_the_total(team):
    attempts_billed(team, 40, billed="0.069")  # $0.009 over each: under the $0.01 floor

    created = reconcile.flag_discrepancies(team, now=NOW)

    flags = period_flags(team)
    day, month = flags[("day", T0.date())], flags[("month", T0.date().replace(day=1))]
    assert created == 2
    assert set(flags) == {("day", T0.date()), ("month", T0.date().replace(day=1))}
    for flag in (day, month):
        assert flag.kind == "over_billed"
        assert flag.attempts_count == 40
        assert flag.recorded_usd == Decimal("2.4000")
        assert flag.billed_usd == Decimal("2.7600")
        assert flag.difference_usd == Decimal("0.3600")
        assert f"over-billed by {money(0.36)} in total (+15.0 %)" in flag.reason
    assert "in the UTC day 2026-03-03" in day.reason
    assert "in the UTC month 2026-03" in month.reason
    assert not DiscrepancyFlag.objects.filter(attempt__isnull=False).exists()  # none per attempt
    assert not team.jobs.filter(events__kind="invoice_discrepancy").exists()


def test_a_second_run_flags_no_period_twice(team):
    attempts_billed(team, 40, billed="0.069")
    reconcile.flag_discrepancies(team, now=NOW)

    again = reconcile.flag_discrepancies(team, now=NOW + timedelta(hours=1))

    assert again == 0
    assert DiscrepancyFlag.objects.filter(team=team).count() == 2


def test_the_month_adds_up_the_days_each_under_the_period_floor(team, settings):
    settings.INVOICE_TOLERANCE_USD = 0.2  # a day's $0.18 passes, the month's $0.36 does not
    attempts_billed(team, 20, billed="0.069")
    attempts_billed(team, 20, billed="0.069", at=T0 + timedelta(days=1), first_instance=9500)

    reconcile.flag_discrepancies(team, now=NOW)

    flags = period_flags(team)
    assert set(flags) == {("month", T0.date().replace(day=1))}
    month = flags[("month", T0.date().replace(day=1))]
    assert (month.attempts_count, month.difference_usd) == (40, Decimal("0.3600"))


def test_differences_that_cancel_out_are_not_a_period_discrepancy(team):
    attempts_billed(team, 20, billed="0.069")
    attempts_billed(team, 20, billed="0.051", first_instance=9500)

    assert reconcile.flag_discrepancies(team, now=NOW) == 0
    assert not DiscrepancyFlag.objects.exists()


def test_attempts_flagged_on_their_own_are_not_counted_again_in_their_period(team):
    attempts_billed(team, 1, billed="0.560", first_instance=9900)  # $0.50 over: its own flag
    attempts_billed(team, 3, billed="0.061")

    reconcile.flag_discrepancies(team, now=NOW)

    assert DiscrepancyFlag.objects.filter(attempt__isnull=False).count() == 1
    assert period_flags(team) == {}


def test_a_reviewed_month_opens_again_when_the_overcharge_goes_on(team):
    attempts_billed(team, 40, billed="0.069")
    reconcile.flag_discrepancies(team, now=NOW)
    month = period_flags(team)[("month", T0.date().replace(day=1))]
    reconcile.mark_reviewed(month, user=None, note="asked Vast", now=NOW)
    later = T0 + timedelta(days=5)
    attempts_billed(team, 40, billed="0.069", at=later, first_instance=9500)
    InvoiceSync.objects.filter(team=team).update(synced_until=later + timedelta(days=1))

    reconcile.flag_discrepancies(team, now=later + timedelta(days=1))

    month.refresh_from_db()
    assert month.status == FlagStatus.OPEN
    assert (month.attempts_count, month.difference_usd) == (80, Decimal("0.7200"))
    assert period_flags(team)[("day", T0.date())].attempts_count == 40  # as it was


def test_a_reviewed_month_stays_reviewed_for_a_few_more_cents(team):
    attempts_billed(team, 40, billed="0.069")
    reconcile.flag_discrepancies(team, now=NOW)
    month = period_flags(team)[("month", T0.date().replace(day=1))]
    reconcile.mark_reviewed(month, user=None, note="asked Vast", now=NOW)
    attempts_billed(team, 1, billed="0.069", at=T0 + timedelta(days=1), first_instance=9500)

    reconcile.flag_discrepancies(team, now=NOW)

    month.refresh_from_db()
    assert month.status == FlagStatus.REVIEWED
    assert (month.attempts_count, month.note) == (40, "asked Vast")  # as reviewed


def test_a_period_flag_closes_when_a_corrected_invoice_adds_up(team):
    attempts = attempts_billed(team, 40, billed="0.069")
    reconcile.flag_discrepancies(team, now=NOW)
    for attempt in attempts:
        item = attempt.charges.get().items.get()
        item.amount, item.quantity, item.description = (
            Decimal("0.060"),
            Decimal("0.15"),
            "0.150 hours at $0.400/hour",
        )
        item.save()

    reconcile.flag_discrepancies(team, now=NOW)

    assert {f.status for f in period_flags(team).values()} == {FlagStatus.REVIEWED}


def test_the_finance_page_shows_the_period_flags_with_total_and_count(client, cast, team):
    attempts_billed(team, 40, billed="0.069")
    reconcile.flag_discrepancies(team, now=NOW)
    client.force_login(cast.finance)

    body = client.get("/finance/team-a/", {"start": "2026-03-01", "end": "2026-03-31"})

    html = body.content.decode()
    # Amounts under $1 in three significant digits (nomadgpu.humanize.money).
    assert "UTC month 2026-03 · 40 attempts · +$0.360 in total" in html
    assert "UTC day 2026-03-03 · 40 attempts · +$0.360 in total" in html
    assert html.count("Mark reviewed") == 2
