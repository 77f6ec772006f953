"""The watchdog and a host that shows ``offline``: wait for it while ``hosts.wait_or_move`` says
waiting is cheaper, move when it no longer is, and note its return once its agent is heard.

Through ``jobs.watchdog.poll.reconcile_attempt`` with the provider's view as parsed instances (the
offline path calls no provider); the whole flow against the sandbox is in
``tests/e2e/test_host_return.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hosts.models import Machine
from hosts.vast import Instance
from jobs.models import Interruption, JobEvent
from jobs.watchdog.poll import reconcile_attempt
from tests.support.factories import JobFactory, MachineFactory, make_attempt

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
MACHINE = 4242
# A rent decision whose move costs the field report's start-up (5.5 min, $0.03 billed) and
# whose restart on the same disk takes 10 s.
DECISION = {
    "chosen": {
        "offer": {"id": 1, "machine_id": MACHINE, "gpu_name": "RTX 4090", "dph_base": 0.35},
        "cost": {"container_start_h": 10 / 3600, "seconds_per_step": 4.0},
        "rental": {"gpu_usd_per_hour": 0.35, "rework_h": 6 / 60, "rework_usd": 0.03},
    }
}


def instance(status: str) -> Instance:
    base = {f: None for f in Instance.__dataclass_fields__ if f not in ("env", "raw")}
    return Instance(**{**base, "id": 9, "actual_status": status})


def running_attempt(state: str = "running", **fields):
    MachineFactory(
        machine_id=MACHINE, gpu_name="RTX 4090", offline_returns=8, offline_return_s=320.0
    )
    heard = {
        "registered_at": NOW - timedelta(minutes=30),
        "last_heartbeat_at": NOW - timedelta(seconds=5),
    }
    attempt, _ = make_attempt(
        JobFactory(),
        state=state,
        instance_id=9,
        machine_id=MACHINE,
        dph_base=0.35,
        decision=DECISION,
        **{**heard, **fields},
    )
    return attempt


def poll(attempt, status: str, now: datetime):
    attempt.refresh_from_db()
    return reconcile_attempt(None, attempt, {9: instance(status)}, {}, now=now)


def test_a_running_attempt_waits_for_a_machine_that_comes_back_quickly(settings):
    settings.HOST_RETURN_CAP_S = 600
    attempt = running_attempt()

    assert poll(attempt, "offline", NOW) is None

    attempt.refresh_from_db()
    assert attempt.offline_since == NOW
    assert attempt.heartbeat_deadline > NOW + timedelta(seconds=600)  # silence waits too
    event = JobEvent.objects.get(job=attempt.job, kind="host_offline")
    assert event.data["wait"] is True
    assert "waiting $" in event.message
    assert "vs moving $" in event.message


def test_its_return_is_noted_once_the_agent_is_heard_again(settings):
    attempt = running_attempt()
    poll(attempt, "offline", NOW)

    assert poll(attempt, "loading", NOW + timedelta(seconds=40)) is None
    assert not JobEvent.objects.filter(kind="host_back").exists()  # the agent is not back yet
    attempt.refresh_from_db()
    assert attempt.heartbeat_deadline == NOW + timedelta(seconds=40 + attempt.job.start_timeout_s)

    type(attempt).objects.filter(pk=attempt.pk).update(
        last_heartbeat_at=NOW + timedelta(seconds=48)
    )
    assert poll(attempt, "running", NOW + timedelta(seconds=50)) is None

    back = JobEvent.objects.get(job=attempt.job, kind="host_back")
    assert back.message.startswith("host came back after 48 s; resumed on the same machine")
    attempt.refresh_from_db()
    assert (attempt.offline_since, attempt.offline_s) == (None, 48.0)
    machine = Machine.objects.get(machine_id=MACHINE)
    assert (machine.offline_returns, machine.offline_return_s) == (9, 368.0)
    assert not Interruption.objects.exists()


def test_it_moves_once_waiting_no_longer_pays_and_dates_the_loss_from_the_start(settings):
    settings.HOST_RETURN_CAP_S = 600
    attempt = running_attempt()
    poll(attempt, "offline", NOW)

    loss = poll(attempt, "offline", NOW + timedelta(seconds=600))

    assert loss.cause == "provider_offline"
    assert loss.since == NOW
    assert "did not come back within 600 s" in loss.detail
    moved = JobEvent.objects.get(job=attempt.job, kind="host_offline_move")
    assert "deadline for waiting passed" in moved.message
    assert Machine.objects.get(machine_id=MACHINE).offline_never == 1


def test_a_host_offline_before_the_agent_ran_is_lost_at_once():
    attempt = running_attempt(state="starting", registered_at=None, last_heartbeat_at=None)

    loss = poll(attempt, "offline", NOW)

    assert loss.cause == "provider_offline"
    assert loss.since is None
    assert not JobEvent.objects.filter(kind="host_offline").exists()


def test_a_drilled_host_that_shows_offline_is_lost_at_once_and_not_on_the_machines_record(
    settings,
):
    settings.HOST_RETURN_CAP_S = 600
    attempt = running_attempt(drilled_at=NOW - timedelta(seconds=2))  # a fire drill destroyed it

    loss = poll(attempt, "offline", NOW)

    assert loss.cause == "provider_offline"
    assert not JobEvent.objects.filter(kind="host_offline").exists()  # no waiting for it
    machine = Machine.objects.get(machine_id=MACHINE)
    assert (machine.offline_returns, machine.offline_never) == (8, 0)
