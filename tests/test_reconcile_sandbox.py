"""The sandbox bills real rentals; reconciliation flags exactly the overcharged host, the host
that billed traffic NomadGPU never saw (the image pull), and the rental made outside it."""

from __future__ import annotations

import time
from datetime import UTC

import pytest
from django.utils import timezone

from billing import invoices, reconcile
from billing.models import Charge, DiscrepancyFlag, InvoiceSync
from hosts import vast
from jobs.models import JobEvent
from tests.support.factories import JobFactory, TeamFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.sandbox import Sandbox, market_offers

# It rents several sandbox instances (a process each): `make test-stress` runs it.
pytestmark = pytest.mark.slow

IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"  # 3.6 GB pulled by the host
CLEAN = 16702039  # 8x H200, $32/h, traffic free
OVERCHARGED = 17394761  # 4x H100 PCIe, $10.4/h, download free; billed twice its usage
TRAFFIC = 17179682  # RTX 4090 that charges $45/TB each way: the field report's first host
OUTSIDE = 16253309  # rented by hand, no NomadGPU attempt


def rent_as_nomadgpu(sandbox: Sandbox, team, ask_id: int):
    """Rent ASK_ID the way NomadGPU records an attempt: rates from the offer, our clock."""
    offer = vast.parse_offer(market_offers()[ask_id])
    job = JobFactory(team=team, name=f"job-{ask_id}")
    rented_at = timezone.now()
    instance_id = sandbox.create(ask_id, image=IMAGE, disk=20, onstart="sleep 600")
    attempt, _ = make_attempt(
        job,
        state="starting",
        instance_id=instance_id,
        rented_at=rented_at,
        dph_base=offer.dph_base,
        storage_usd_per_gb_hour=offer.storage_usd_per_gb_hour,
        download_usd_per_gb=offer.download_usd_per_gb,
        upload_usd_per_gb=offer.upload_usd_per_gb,
        disk_gb=20,
    )
    return attempt


def mark_running_when_billed(sandbox: Sandbox, attempt) -> float:
    """Record ATTEMPT running when a poll first sees it running, as the agent's register would.

    Returns how much earlier the sandbox can have started billing: it switched after the last
    poll that still saw it starting was sent. On a loaded machine that is tenths of a second, so
    the test bounds the clock error by what it measured, not by a fixed share of the bill."""
    asked = attempt.rented_at.timestamp()  # before the create: no bill can start earlier
    deadline = time.monotonic() + 20
    while True:
        sent = time.time()
        if sandbox.status(attempt.instance_id) == "running":
            break
        asked = sent
        if time.monotonic() > deadline:
            pytest.fail(f"instance {attempt.instance_id} not running after 20 s")
        time.sleep(0.02)
    attempt.registered_at = attempt.running_at = timezone.now()
    attempt.state = "running"
    attempt.save()
    return attempt.running_at.timestamp() - asked


def end(sandbox: Sandbox, attempt) -> float:
    """Destroy ATTEMPT's instance and record it ended; returns how much earlier the sandbox can
    have stopped billing (it did so while the delete was in flight)."""
    sent = time.time()
    sandbox.client().delete(f"/api/v0/instances/{attempt.instance_id}/").raise_for_status()
    attempt.ended_at = timezone.now()
    attempt.state = "ended"
    attempt.save()
    return attempt.ended_at.timestamp() - sent


@pytest.mark.django_db(transaction=True)
def test_reconciliation_flags_exactly_the_overcharge_the_traffic_and_the_outsider(
    sandbox: Sandbox,
):
    # The team's own account: every charge on it is the team's, so an outside rental shows.
    team = TeamFactory(slug="recon", vast_url=sandbox.url, vast_api_key="sandbox-key")
    clean, over, traffic = (
        rent_as_nomadgpu(sandbox, team, a) for a in (CLEAN, OVERCHARGED, TRAFFIC)
    )
    outsider_id = sandbox.create(OUTSIDE, image="ubuntu:22.04", disk=10, onstart="sleep 600")
    sandbox.inject(over.instance_id, "overcharge", 100)
    started_late = {a.pk: mark_running_when_billed(sandbox, a) for a in (clean, over, traffic)}
    # Let the GPUs bill long enough for real money: $0.10 on the H200 is about 11 s.
    wait_until(
        lambda: sandbox.debug(clean.instance_id)["billed"]["gpu"] >= 0.10,
        timeout=60,
        what="the H200 to bill $0.10 of GPU time",
        every=0.2,
    )
    ended_late = {a.pk: end(sandbox, a) for a in (clean, over, traffic)}
    sandbox.client().delete(f"/api/v0/instances/{outsider_id}/").raise_for_status()

    now = timezone.now()
    invoices.sync_team(team, now=now)
    created = reconcile.flag_discrepancies(team, now=now)

    rows = {a.pk: reconcile.reconcile_attempt(a, now=now, covered=now) for a in team_attempts(team)}
    assert rows[clean.pk].status == reconcile.Status.MATCHED
    assert rows[clean.pk].billed >= 0.10
    # The clean host's GPU line differs only by the two clocks: our records are at most
    # STARTED_LATE short and ENDED_LATE long of the seconds the sandbox billed.
    gpu = rows[clean.pk].components[0]
    billed_s = sandbox.debug(clean.instance_id)["usage"]["gpu_s"]
    off_s = gpu.recorded_qty * 3600 - billed_s
    assert -started_late[clean.pk] - 0.01 <= off_s <= ended_late[clean.pk] + 0.01, gpu
    assert gpu.billed == pytest.approx(billed_s / 3600 * gpu.recorded_rate, abs=0.0005)

    assert rows[over.pk].status == reconcile.Status.OVER_BILLED
    # The overcharge doubles every billed quantity; our record differs from the seconds the
    # sandbox used only by the two clocks (as for the clean host), which bounds the percentage:
    # 100 % when they agree, within a point of the bound they allow (its storage is $0.00002).
    used_s = sandbox.debug(over.instance_id)["usage"]["gpu_s"]
    low = 200 * used_s / (used_s + ended_late[over.pk] + 0.01) - 100
    high = 200 * used_s / (used_s - started_late[over.pk] - 0.01) - 100
    assert low - 1 <= rows[over.pk].pct <= high + 1, (rows[over.pk].pct, low, high)
    assert rows[over.pk].reason.startswith("GPU hours billed beyond the rental")

    assert rows[traffic.pk].status == reconcile.Status.OVER_BILLED
    assert rows[traffic.pk].reason.startswith("traffic: 3.353 GB download billed")
    download = rows[traffic.pk].components[2]
    assert download.billed == pytest.approx(3.6e9 / 1024**3 * 0.0439453125, abs=0.002)

    unmatched = Charge.objects.get(team=team, attempt__isnull=True)
    assert unmatched.source == f"instance-{outsider_id}"

    flagged = DiscrepancyFlag.objects.filter(team=team)
    assert created == 3
    assert {f.attempt_id for f in flagged if f.attempt_id} == {over.pk, traffic.pk}
    assert {f.charge_id for f in flagged if f.charge_id} == {unmatched.pk}

    events = JobEvent.objects.filter(kind="invoice_discrepancy")
    assert sorted(e.job_id for e in events) == sorted([over.job_id, traffic.job_id])
    assert reconcile.flag_discrepancies(team, now=timezone.now()) == 0  # once, not per run
    assert JobEvent.objects.filter(kind="invoice_discrepancy").count() == 2

    cost = reconcile.job_cost(clean.job)
    assert cost.basis == "invoiced"
    assert cost.amount == pytest.approx(rows[clean.pk].billed)


def team_attempts(team):
    from jobs.models import Attempt

    return Attempt.objects.filter(job__team=team).prefetch_related(reconcile.charges_prefetch())


WEEK_S = 6 * 86_400  # six days back: the rental touches seven UTC days


@pytest.mark.django_db(transaction=True)
def test_a_week_imported_day_by_day_twice_matches_the_range_and_stores_each_day_once(
    sandbox: Sandbox,
):
    team = TeamFactory(slug="week", vast_url=sandbox.url, vast_api_key="sandbox-key")
    attempt = rent_as_nomadgpu(sandbox, team, CLEAN)
    mark_running_when_billed(sandbox, attempt)
    # As if rented six days ago and billing since: seven day rows, the first after 00:00.
    sandbox.inject(attempt.instance_id, "age", WEEK_S)
    end(sandbox, attempt)
    rented = attempt.rented_at - timezone.timedelta(seconds=WEEK_S)
    type(attempt).objects.filter(pk=attempt.pk).update(rented_at=rented, registered_at=rented)

    now = timezone.now()
    invoices.sync_team(team, now=now)
    first = day_rows(team)
    InvoiceSync.objects.filter(team=team).update(charges_complete_through=None)
    invoices.sync_team(team, now=now)  # every day asked again

    assert day_rows(team) == first
    assert len(first) == 7  # one row per day, none stored twice
    assert [day for day, *_ in first] == [rented.date() + timezone.timedelta(n) for n in range(7)]
    assert {attempt_id for *_, attempt_id in first} == {attempt.pk}  # matched by contract and day
    start = timezone.datetime.combine(rented.date(), timezone.datetime.min.time(), tzinfo=UTC)
    (whole,) = vast.VastClient("sandbox-key", sandbox.url).charges(start, now)
    stored = sum(amount for _, amount, _ in first)
    assert float(stored) == pytest.approx(float(whole.amount), abs=0.0005 * 7)
    assert (whole.start, whole.end) == (start, start + timezone.timedelta(days=6))


def day_rows(team) -> list[tuple]:
    return list(
        Charge.objects.filter(team=team).order_by("day").values_list("day", "amount", "attempt_id")
    )
