"""A rent's claim names its process, so a claim whose worker died is settled at once
(``jobs.renting.claims``, ``jobs.renting.settle.settle_dead_claim``); an adopted instance is
recorded at the rates of the offer the create was sent for (``settle.adopted_fields``). The real
SIGKILL of a worker is ``tests/e2e/test_worker_death.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from hosts.vast.parsing import parse_instance
from jobs.models import Attempt, JobState
from jobs.renting import claims, settle
from jobs.watchdog import passes
from tests.support.factories import JobFactory, make_attempt

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_this_process_is_alive_and_a_finished_one_is_not():
    assert claims.claimer_alive(claims.this_process()) is True
    host = socket.gethostname()
    assert claims.claimer_alive(f"{host}:{dead_pid()}:") is False


def test_a_reused_pid_is_not_taken_for_the_claimer():
    # Same pid, another start time: another program now runs under it.
    host, pid, start = claims.this_process().split(":")
    assert claims.claimer_alive(f"{host}:{pid}:{int(start) + 1}") is False


def test_a_claim_from_another_host_is_only_known_dead_by_its_time_limit(settings):
    settings.VAST_TASK_SOFT_LIMIT_S = 300
    assert claims.claimer_alive("elsewhere:123:456") is None
    attempt = Attempt(rent_claimed_by="elsewhere:123:456", requested_at=NOW)

    assert not claims.claim_is_dead(attempt, now=NOW + timedelta(seconds=329))
    assert claims.claim_is_dead(attempt, now=NOW + timedelta(seconds=331))


def requested(**fields) -> Attempt:
    job = JobFactory(state="renting", requirements={"gpu_names": ["RTX 4090"]})
    attempt, _ = make_attempt(
        job,
        state="requested",
        label=f"ngpu:test:{job.pk}:1",
        requested_at=NOW - timedelta(seconds=5),
        rent_claimed_by=f"{socket.gethostname()}:{dead_pid()}:",
        **fields,
    )
    return attempt


@pytest.mark.django_db
def test_a_dead_claim_with_no_create_sent_ends_and_the_job_is_planned_in_the_same_tick(
    django_capture_on_commit_callbacks,
):
    attempt = requested()

    with django_capture_on_commit_callbacks():
        report = passes.tick(now=NOW, poll_provider=False)

    attempt.refresh_from_db()
    assert report["settled"] == 1
    assert (attempt.state, attempt.end_reason) == ("ended", "rent_interrupted")
    assert report["planned"] == 1
    job = attempt.job
    job.refresh_from_db()
    assert job.state == JobState.RENTING
    assert job.attempts.get(number=2).state == "planned"
    event = job.events.get(kind="rent_interrupted")
    assert event.message == "the worker renting attempt 1 stopped before asking Vast; renting again"


@pytest.mark.django_db
def test_a_dead_claim_whose_create_was_sent_waits_for_the_poll_to_adopt(settings):
    settings.ADOPT_AFTER_S = 30
    attempt = requested(create_sent_at=NOW - timedelta(seconds=2))

    assert passes.tick(now=NOW, poll_provider=False)["settled"] == 0
    assert settle.settle_dead_claim(attempt, None, now=NOW) == "waiting"
    # Nothing appeared at Vast within ADOPT_AFTER_S: the create made no instance.
    assert settle.settle_dead_claim(attempt, None, now=NOW + timedelta(seconds=30)) == "settled"


INSTANCE_WITHOUT_TRAFFIC_PRICES = {
    # Vast's documented instance schema: no inet_down_cost / inet_up_cost.
    "id": 901,
    "machine_id": 77,
    "gpu_name": "RTX 4090",
    "dph_base": 0.35,
    "storage_cost": 0.15,
    "disk_space": 20,
    "actual_status": "loading",
    "label": "ngpu:test:1:1",
    "is_bid": False,
}


@pytest.mark.django_db
def test_an_adopted_instance_takes_the_traffic_prices_of_the_offer_its_create_was_sent_for():
    attempt = requested(
        create_sent_at=NOW,
        offer_id=5,
        download_usd_per_gb=0.02,
        upload_usd_per_gb=0.01,
        dph_base=0.34,
    )
    instance = parse_instance(INSTANCE_WITHOUT_TRAFFIC_PRICES)

    assert settle.settle_dead_claim(attempt, instance, now=NOW) == "adopted"

    attempt.refresh_from_db()
    assert attempt.state == "starting"
    assert (attempt.download_usd_per_gb, attempt.upload_usd_per_gb) == (0.02, 0.01)
    assert attempt.dph_base == 0.35  # what the instance shows wins over the offer


@pytest.mark.django_db
def test_without_a_recorded_offer_the_machines_last_known_offer_prices_the_traffic():
    earlier = JobFactory()
    make_attempt(
        earlier, state="ended", machine_id=77, offer_id=3, download_usd_per_gb=0.03,
        upload_usd_per_gb=0.015,
    )  # fmt: skip
    attempt = requested()  # an older claim: no offer recorded with it
    fields = settle.adopted_fields(attempt, parse_instance(INSTANCE_WITHOUT_TRAFFIC_PRICES))

    assert (fields["download_usd_per_gb"], fields["upload_usd_per_gb"]) == (0.03, 0.015)
