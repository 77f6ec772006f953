"""What NomadGPU records against what the sandbox bills, through the real provider poll
(``jobs.watchdog.poll.reconcile_account``) and the real invoice import: a job whose machine
already holds its image is recorded with no pull and costs what it is billed; a short
attempt's GPU time, recorded from the poll's first ``running`` read, is the seconds billed,
where the agent's register would read short by its bootstrap."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from billing import image_pull, invoices, reconcile
from billing.cost import INVOICED, RECORDED, job_cost
from billing.spend import GB, attempt_spend
from hosts import selection, vast
from jobs.models import Attempt
from jobs.renting.image_cache import image_cached_odds
from jobs.watchdog.poll import reconcile_account
from tests.support.factories import JobFactory, TeamFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.sandbox import Sandbox, market_offers

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"  # 3.6e9 bytes pulled by the host
IMAGE_GB = 3.6e9 / GB  # the profile's image_gb, as a measured profile would carry it
TRAFFIC = 17179682  # an RTX 4090 that charges $45/TB each way: a pull costs $0.147 there
CLEAN = 16702039  # 8x H200, $32/h, traffic free: a second of GPU is $0.0089
BOOTSTRAP_S = 2.0  # the agent's start after the container's: what its register is late by


def rent(sandbox: Sandbox, team, name: str, ask_id: int, **fields) -> Attempt:
    """Rent ASK_ID for a new job NAME the way NomadGPU does: the rates and the rent decision
    (the image as priced, the chosen offer, the chance the team's history gives its machine
    of still holding the image: ``jobs.renting.image_cache``) kept before the create."""
    offer = vast.parse_offer(market_offers()[ask_id])
    chance = image_cached_odds(team.pk, IMAGE).chance(offer.machine_id)
    summary = selection.offer_summary(offer, selection.Requirements(disk_gb=20, rental="on-demand"))
    decision = {
        "profile": {"image_gb": IMAGE_GB},
        "chosen": {"offer": summary, "cost": {"image_cached_chance": chance}},
    }
    job = JobFactory(team=team, name=name, image=IMAGE)
    rented_at = timezone.now()
    instance_id = sandbox.create(ask_id, image=IMAGE, disk=20, onstart="sleep 600")
    attempt, _ = make_attempt(
        job,
        state="starting",
        instance_id=instance_id,
        machine_id=offer.machine_id,
        rented_at=rented_at,
        decision=decision,
        dph_base=offer.dph_base,
        storage_usd_per_gb_hour=offer.storage_usd_per_gb_hour,
        download_usd_per_gb=offer.download_usd_per_gb,
        upload_usd_per_gb=offer.upload_usd_per_gb,
        disk_gb=20,
        **fields,
    )
    return attempt


def poll_until_running(sandbox: Sandbox, team, attempt: Attempt) -> float:
    """Run the provider poll's step for TEAM's account until it has read ATTEMPT running, as
    the watchdog does each PROVIDER_POLL_INTERVAL_S (here back to back); returns how far the
    moment kept can be after the switch: the answer read running came after the poll before
    it was sent (the moment kept is when the answer came, never before the switch)."""
    before = attempt.rented_at.timestamp()  # no bill can start before the create
    deadline = time.monotonic() + 20
    while True:
        now = timezone.now()
        with vast.VastClient(team.vast_api_key, team.vast_url) as client:
            instances = client.list_instances()  # as poll_providers reads an account
            reconcile_account(client, [attempt], instances, now, read_at=timezone.now())
        attempt.refresh_from_db()
        if attempt.provider_running_at is not None:
            return time.time() - before
        before = now.timestamp()
        assert time.monotonic() < deadline, f"instance {attempt.instance_id} not running"


def agent_registers(sandbox: Sandbox, attempt: Attempt) -> None:
    """The agent's first call, BOOTSTRAP_S of billed GPU after its container started."""
    wait_until(
        lambda: sandbox.debug(attempt.instance_id)["usage"]["gpu_s"] >= BOOTSTRAP_S,
        timeout=30,
        what="the agent's bootstrap",
        every=0.05,
    )
    Attempt.objects.filter(pk=attempt.pk).update(registered_at=timezone.now(), state="running")
    attempt.refresh_from_db()


def end(sandbox: Sandbox, attempt: Attempt) -> float:
    """Destroy ATTEMPT's instance and record it ended; returns how much earlier the sandbox can
    have stopped billing (it did so while the delete was in flight)."""
    sent = time.time()
    sandbox.client().delete(f"/api/v0/instances/{attempt.instance_id}/").raise_for_status()
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now(), state="ended")
    attempt.refresh_from_db()
    return attempt.ended_at.timestamp() - sent


def billed_exactly(sandbox: Sandbox, attempt: Attempt) -> float:
    """What the sandbox billed ATTEMPT, before its invoice rounds each item to 3 decimals."""
    return sum(sandbox.debug(attempt.instance_id)["billed"].values())


def test_a_job_on_a_machine_that_holds_its_image_is_recorded_with_no_pull_and_costs_its_bill(
    sandbox: Sandbox,
):
    team = TeamFactory(slug="cached", vast_url=sandbox.url, vast_api_key="sandbox-key")
    first = rent(sandbox, team, "first-pull", TRAFFIC)  # the machine pulls the image
    poll_until_running(sandbox, team, first)
    agent_registers(sandbox, first)
    end(sandbox, first)

    cached = rent(sandbox, team, "cached-image", TRAFFIC)  # the same machine, rented again
    started_late = poll_until_running(sandbox, team, cached)
    agent_registers(sandbox, cached)
    wait_until(
        lambda: billed_exactly(sandbox, cached) >= 0.003,
        timeout=60,
        what="the cached-image job to bill $0.003",
        every=0.2,
    )
    ended_late = end(sandbox, cached)
    recorded = job_cost(cached.job)
    bill = billed_exactly(sandbox, cached)
    invoices.sync_team(team, now=timezone.now())
    invoiced = job_cost(cached.job)

    assert sandbox.debug(cached.instance_id)["image_source"] == "machine"  # no pull happened
    # Docker said "up to date" if a poll caught the short load, else the load was short.
    kept = image_pull.recorded_pull(cached, now=timezone.now())
    assert (kept.bytes, kept.why in (image_pull.SAID_KEPT, image_pull.KEPT)) == (0, True)
    assert attempt_spend(cached, now=timezone.now()).download == 0.0
    # The first rental did pull, and was recorded with it, as billed.
    pulled = image_pull.recorded_pull(first, now=timezone.now())
    assert pulled.bytes == int(IMAGE_GB * GB)
    row = reconcile.reconcile_attempt(first, now=timezone.now(), covered=timezone.now())
    download = row.components[2]
    assert download.recorded == pytest.approx(download.billed, abs=0.0005)  # 3 decimals

    # Recorded against billed: only the two clocks apart (GPU at the RTX 4090's $/h).
    clocks_usd = (started_late + ended_late) * cached.dph_base / 3600 + 1e-6
    assert recorded.basis == RECORDED
    assert abs(float(recorded.total) - bill) <= clocks_usd, (recorded.text, bill)
    assert invoiced.basis == INVOICED
    assert abs(float(invoiced.total) - bill) <= 0.0005 * 2 + 1e-9  # GPU and disk, 3 decimals
    phantom = IMAGE_GB * cached.download_usd_per_gb  # what the whole pull would have added
    assert phantom > 30 * clocks_usd


def test_a_short_attempts_gpu_time_is_recorded_from_the_polls_first_running_read(
    sandbox: Sandbox,
):
    team = TeamFactory(slug="short", vast_url=sandbox.url, vast_api_key="sandbox-key")
    attempt = rent(sandbox, team, "short", CLEAN)
    started_late = poll_until_running(sandbox, team, attempt)
    agent_registers(sandbox, attempt)
    wait_until(
        lambda: sandbox.debug(attempt.instance_id)["usage"]["gpu_s"] >= 12,
        timeout=60,
        what="a dozen seconds of GPU",
        every=0.1,
    )
    ended_late = end(sandbox, attempt)
    billed_s = sandbox.debug(attempt.instance_id)["usage"]["gpu_s"]
    invoices.sync_team(team, now=timezone.now())

    now = timezone.now()
    row = reconcile.reconcile_attempt(
        Attempt.objects.prefetch_related(reconcile.charges_prefetch()).get(pk=attempt.pk),
        now=now,
        covered=now,
    )
    gpu = row.components[0]
    off_s = gpu.recorded_qty * 3600 - billed_s
    assert -started_late - 0.01 <= off_s <= ended_late + 0.01, gpu
    assert row.status == reconcile.Status.MATCHED
    # From the agent's register it would have read short by the bootstrap and more.
    registered_s = (attempt.ended_at - attempt.registered_at).total_seconds()
    assert billed_s - registered_s >= BOOTSTRAP_S - ended_late - 0.01
    assert (attempt.registered_at - attempt.provider_running_at) >= timedelta(
        seconds=BOOTSTRAP_S - started_late
    )
