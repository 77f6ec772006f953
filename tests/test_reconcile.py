"""Reconciliation decisions on stored charges: statuses, reasons, job cost basis, savings."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import reconcile
from billing.reconcile import Status, Tolerance
from tests.support.charges import DAY0, bill
from tests.support.factories import (
    ChargeFactory,
    InvoiceSyncFactory,
    JobFactory,
    TeamFactory,
    make_attempt,
)

T0 = datetime(2026, 3, 1, 10, tzinfo=UTC)  # on DAY0
GB = 1024**3


def field_report_attempt(team, *, instance_id=101, bytes_down=0, **over):
    """0.44 h on an RTX 4090 at $0.40/h, 19 min of it training (the field report's run)."""
    job = JobFactory(team=team, name=f"qlora-{instance_id}")
    fields = {
        "state": "ended",
        "instance_id": instance_id,
        "rented_at": T0,
        "registered_at": T0 + timedelta(minutes=6),
        "running_at": T0 + timedelta(hours=0.44) - timedelta(minutes=19),
        "ended_at": T0 + timedelta(hours=0.44),
        "dph_base": 0.40,
        "storage_usd_per_gb_hour": 0.0,
        "download_usd_per_gb": 0.0439453125,
        "bytes_down": bytes_down,
        **over,
    }
    attempt, _ = make_attempt(job, **fields)
    return attempt


def reconciled(attempt, **kw):
    attempt = (
        type(attempt).objects.prefetch_related(reconcile.charges_prefetch()).get(pk=attempt.pk)
    )
    return reconcile.reconcile_attempt(
        attempt, now=T0 + timedelta(days=2), covered=T0 + timedelta(days=1), **kw
    )


@pytest.mark.parametrize(
    ("recorded", "billed", "status"),
    [
        (1.00, 1.019, Status.MATCHED),  # within 2 %
        (1.00, 1.021, Status.OVER_BILLED),
        (0.10, 0.109, Status.MATCHED),  # 9 % but under $0.01
        (0.10, 0.089, Status.UNDER_BILLED),
    ],
)
def test_the_tolerance_is_two_percent_or_a_cent(recorded, billed, status):
    assert reconcile.difference_status(recorded, billed, Tolerance()) == status


@pytest.mark.django_db
def test_a_bill_that_matches_the_recorded_rates_is_matched():
    attempt = field_report_attempt(TeamFactory())
    gpu_h = (attempt.ended_at - attempt.registered_at).total_seconds() / 3600
    bill(attempt, ("gpu", f"{gpu_h:.3f} hours at $0.400/hour", f"{gpu_h * 0.4:.3f}"))

    row = reconciled(attempt)

    assert row.status == Status.MATCHED
    assert row.reason == ""


@pytest.mark.django_db
def test_traffic_the_agent_never_saw_is_over_billed_with_traffic_as_the_reason():
    attempt = field_report_attempt(TeamFactory(), bytes_down=1 * GB)
    gpu_h = (attempt.ended_at - attempt.registered_at).total_seconds() / 3600
    bill(
        attempt,
        ("gpu", f"{gpu_h:.3f} hours at $0.400/hour", f"{gpu_h * 0.4:.3f}"),
        ("bwd", "15.000 GB downloaded at $0.043945/GB", "0.659"),
    )

    row = reconciled(attempt)

    assert row.status == Status.OVER_BILLED
    assert row.reason == "traffic: 15.000 GB download billed vs 1.000 GB recorded"
    assert row.diff == pytest.approx(14 * 0.0439453125, abs=0.002)


@pytest.mark.django_db
def test_gpu_billed_from_creation_reads_as_start_up_billed_while_loading():
    attempt = field_report_attempt(TeamFactory())
    bill(attempt, ("gpu", "0.440 hours at $0.400/hour", "0.176"))  # recorded: 0.34 h

    row = reconciled(attempt)

    assert row.status == Status.OVER_BILLED
    assert row.reason.startswith("start-up billed while loading")


@pytest.mark.django_db
def test_storage_billed_after_the_instance_stopped_says_so():
    attempt = field_report_attempt(TeamFactory(), storage_usd_per_gb_hour=0.001, disk_gb=50)
    gpu_h = (attempt.ended_at - attempt.registered_at).total_seconds() / 3600
    bill(
        attempt,
        ("gpu", f"{gpu_h:.3f} hours at $0.400/hour", f"{gpu_h * 0.4:.3f}"),
        ("disk", "50.0 GB for 0.440 hours at $0.720/GB/month", "0.022"),
    )
    # The next day's row: storage of a contract that ended the day before.
    bill(
        attempt,
        ("disk", "50.0 GB for 10.000 hours at $0.720/GB/month", "0.500"),
        day=DAY0 + timedelta(days=1),
    )

    row = reconciled(attempt)

    assert row.status == Status.OVER_BILLED
    assert row.reason.startswith("storage after stop")


def storage_attempt():
    """The field report's run on a 50 GB disk at $0.001/GB/h: the disk costs $0.05/h."""
    return field_report_attempt(TeamFactory(), storage_usd_per_gb_hour=0.001, disk_gb=50)


def gpu_item(attempt) -> tuple[str, str, str]:
    gpu_h = (attempt.ended_at - attempt.registered_at).total_seconds() / 3600
    return ("gpu", f"{gpu_h:.3f} hours at $0.400/hour", f"{gpu_h * 0.4:.3f}")


@pytest.mark.django_db
def test_storage_billed_in_vasts_hours_is_compared_as_hours_at_the_disks_hourly_rate():
    attempt = storage_attempt()
    # Vast's billing page words storage as "0.9765233 hours at $0.018/hour": the whole disk.
    bill(attempt, gpu_item(attempt), ("disk", "0.4400000 hours at $0.050/hour", "0.022"))

    row = reconciled(attempt)

    storage = row.components[1]
    assert storage.unit == "h"
    assert storage.billed_qty == pytest.approx(0.44)
    assert storage.recorded_qty == pytest.approx(0.44)  # the hours the disk existed
    assert storage.recorded_rate == pytest.approx(0.05)  # 50 GB x $0.001/GB/h
    assert storage.billed_rate == pytest.approx(0.05)
    assert row.status == Status.MATCHED


@pytest.mark.django_db
def test_more_storage_hours_billed_than_the_disk_existed_says_so_in_hours():
    attempt = storage_attempt()
    bill(attempt, gpu_item(attempt), ("disk", "1.5000000 hours at $0.050/hour", "0.075"))

    row = reconciled(attempt)

    assert row.status == Status.OVER_BILLED
    assert row.reason == "storage: 1.500 h billed vs 0.440 h recorded"


@pytest.mark.django_db
def test_storage_in_the_old_monthly_wording_is_still_compared_in_gb_hours():
    attempt = storage_attempt()
    bill(
        attempt, gpu_item(attempt), ("disk", "50.0 GB for 1.500 hours at $0.720/GB/month", "0.075")
    )

    row = reconciled(attempt)

    assert row.components[1].unit == "GB-h"
    assert row.reason == "storage: 75.000 GB-h billed vs 22.000 GB-h recorded"


@pytest.mark.django_db
def test_storage_days_in_both_wordings_are_never_summed_into_one_quantity():
    attempt = storage_attempt()
    bill(attempt, gpu_item(attempt), ("disk", "0.2000000 hours at $0.050/hour", "0.010"))
    bill(
        attempt,
        ("disk", "50.0 GB for 0.240 hours at $0.720/GB/month", "0.012"),
        day=DAY0 + timedelta(days=1),
    )

    storage = reconciled(attempt).components[1]

    assert storage.billed_qty is None  # 0.2 h and 12 GB-h do not add up
    assert storage.billed == pytest.approx(0.022)


@pytest.mark.django_db
def test_storage_in_an_unknown_wording_keeps_its_amount_and_is_compared_in_money():
    attempt = storage_attempt()
    bill(attempt, gpu_item(attempt), ("disk", "Storage charges", "0.075"))

    row = reconciled(attempt)

    assert row.components[1].billed_qty is None
    assert row.components[1].billed == pytest.approx(0.075)
    assert row.reason == "storage: $0.0750 billed vs $0.0220 recorded (item text unparsed)"


@pytest.mark.django_db
def test_usage_without_any_charge_is_unbilled_and_a_live_attempt_is_pending():
    team = TeamFactory()
    unbilled = field_report_attempt(team)
    live = field_report_attempt(team, instance_id=102, state="running", ended_at=None)

    assert reconciled(unbilled).status == Status.UNBILLED_USAGE
    assert reconciled(live).status == Status.PENDING


@pytest.mark.django_db
def test_charges_are_matched_by_instance_id_and_time_only():
    team = TeamFactory()
    attempt = field_report_attempt(team)
    common = {"team": team, "amount": Decimal("0.1"), "origin": "api"}
    ours = ChargeFactory(
        source="instance-101", instance_id=101, day=T0.date(), start=T0, end=T0, **common
    )
    later = ChargeFactory(  # same id, months later: not this rental
        source="instance-101",
        instance_id=101,
        day=date(2026, 7, 1),
        start=datetime(2026, 7, 1, tzinfo=UTC),
        end=datetime(2026, 7, 1, 1, tzinfo=UTC),
        **common,
    )
    stranger = ChargeFactory(
        source="instance-999", instance_id=999, day=T0.date(), start=T0, end=T0, **common
    )

    assert reconcile.match_charges(team, now=T0 + timedelta(days=200)) == 1

    ours.refresh_from_db(), later.refresh_from_db(), stranger.refresh_from_db()
    assert ours.attempt_id == attempt.pk
    assert later.attempt_id is None
    assert stranger.attempt_id is None


@pytest.mark.django_db
def test_a_jobs_cost_is_recorded_until_its_invoice_is_imported():
    attempt = field_report_attempt(TeamFactory())
    job = attempt.job
    estimate = reconcile.job_cost(job, now=T0 + timedelta(days=2))
    assert estimate.basis == "recorded"
    assert estimate.amount == pytest.approx(0.40 * (0.44 - 0.1), abs=0.001)

    bill(attempt, ("gpu", "0.475 hours at $0.400/hour", "0.190"))
    InvoiceSyncFactory(team=job.team, synced_until=T0 + timedelta(days=1))

    invoiced = reconcile.job_cost(job, now=T0 + timedelta(days=2))
    assert invoiced.basis == "invoiced"
    assert invoiced.amount == pytest.approx(0.19)


def test_the_field_report_savings_against_an_a100_on_demand():
    team = TeamFactory.build()  # default reference: $4.10/h, speed factor 1

    same_speed = reconcile.savings(team, cost=0.19, machine_h=0.44, training_h=19 / 60)
    team.reference_speed_factor = Decimal("1.5")
    faster = reconcile.savings(team, cost=0.19, machine_h=0.44, training_h=19 / 60)

    assert same_speed.reference_usd == pytest.approx(1.80, abs=0.01)
    assert faster.reference_usd == pytest.approx(1.35, abs=0.03)
    assert same_speed.saved_pct == pytest.approx(89, abs=0.6)
    assert faster.saved_pct == pytest.approx(86, abs=0.6)


@pytest.mark.django_db
def test_a_job_shows_its_savings_from_its_attempts_hours():
    attempt = field_report_attempt(TeamFactory())
    bill(attempt, ("gpu", "0.475 hours at $0.400/hour", "0.190"))
    InvoiceSyncFactory(team=attempt.job.team, synced_until=T0 + timedelta(days=1))

    row = reconcile.reconcile_job(attempt.job, now=T0 + timedelta(days=2))

    assert row.savings.cost == pytest.approx(0.19)
    assert row.savings.reference_usd == pytest.approx(1.80, abs=0.01)


@pytest.mark.django_db
def test_a_flag_closes_itself_when_a_corrected_invoice_matches():
    from billing.models import DiscrepancyFlag, FlagStatus

    attempt = field_report_attempt(TeamFactory())
    team = attempt.job.team
    InvoiceSyncFactory(team=team, synced_until=T0 + timedelta(days=1))
    charge = bill(attempt, ("gpu", "0.440 hours at $0.400/hour", "0.176"))
    now = T0 + timedelta(days=2)
    assert reconcile.flag_discrepancies(team, now=now) == 1

    item = charge.items.get()
    item.description, item.amount, item.quantity = (
        "0.340 hours at $0.400/hour",
        Decimal("0.136"),
        Decimal("0.34"),
    )
    item.save()
    assert reconcile.flag_discrepancies(team, now=now) == 0

    flag = DiscrepancyFlag.objects.get(attempt=attempt)
    assert flag.status == FlagStatus.REVIEWED
    assert flag.reviewed_by is None
    assert "matches the invoice" in flag.note
    assert attempt.job.events.filter(kind="invoice_discrepancy").count() == 1
