"""A host that reboots: the job waits for it when waiting is cheaper than moving
(``hosts.wait_or_move``), and resumes on the same machine from the checkpoint on its disk; or,
when it does not come back in time, moves after the cap and the offline instance is destroyed.

The sandbox's ``reboot-host`` kills the container, shows the instance ``offline`` (nothing
billed) and brings it back after the given wall seconds (or never) through rebooting, loading
and running with its disk intact, onstart again. The job's profile is the field report's
start-up (a 4 GB image and a 15 GB model to download on a new host: minutes), and the machine
is given a history of quick returns, so that waiting is the cheaper choice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hosts.models import Machine
from jobs.models import Interruption, JobEvent, JobState
from tests.support.instances import InstanceWatch, live_instances
from tests.support.processes import wait_until
from tests.support.toy import final_digest_of, submit, toy_digest, toy_env
from tests.support.waiting import wait_checkpoint, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ENV = toy_env(steps=120, every=20, step_seconds=0.04)  # ~5 s of training
FIELD_REPORT_START_UP = {"image_gb": 4.0, "model_gb": 15.0, "upload_gb": 0.01}


def submit_costly_to_move(supervisor):
    # Beats every 3 s: the provider's listing (polled every second here) says "offline"
    # before the silence would (a 1 s beat's timeout is 1.75 s).
    return submit(supervisor, ENV, profile=FIELD_REPORT_START_UP, heartbeat_interval_s=3)


def comes_back_quickly(machine_id: int) -> None:
    """The machine's history in our attempts: 20 offline spells, each back within 2 s."""
    Machine.objects.filter(machine_id=machine_id).update(
        offline_returns=20, offline_return_s=40.0, offline_never=0
    )


def wait_event(job, kind: str, timeout: float = 30) -> JobEvent:
    return wait_until(
        lambda: JobEvent.objects.filter(job=job, kind=kind).order_by("-pk").first(),
        timeout=timeout,
        what=f"a {kind} event of job {job.pk}",
    )


def test_a_host_that_comes_back_within_the_cap_resumes_the_same_attempt(supervisor, settings):
    settings.HOST_RETURN_CAP_S = 15
    job = submit_costly_to_move(supervisor)
    with InstanceWatch(supervisor.sandbox) as watch:
        first = wait_running(job, 1)
        comes_back_quickly(first.machine_id)
        wait_checkpoint(job, attempt=first, above=0)

        supervisor.sandbox.inject(first.instance_id, "reboot-host", 2)

        waiting = wait_event(job, "host_offline")
        assert waiting.data["wait"] is True, waiting.message
        assert waiting.data["wait_usd"] < waiting.data["move_usd"]
        assert "wait up to 15 s" in waiting.message
        back = wait_event(job, "host_back")
        wait_state(job, JobState.SUCCEEDED, timeout=60)

    assert "resumed on the same machine" in back.message
    assert back.message.startswith("host came back after ")
    assert job.attempts.count() == 1  # the same attempt went on: no new rent
    assert watch.ids_for(job) == {first.instance_id}  # one instance, ever
    assert not Interruption.objects.filter(job=job).exists()
    attempt = job.attempts.get()
    assert attempt.offline_since is None
    assert attempt.offline_s == pytest.approx(back.data["offline_s"], abs=0.1)
    agent_log = Path(
        supervisor.sandbox.debug(first.instance_id)["scratch"], ".nomadgpu", "agent.log"
    )
    assert "is already on this disk (" in agent_log.read_text()  # the restore downloaded nothing
    assert attempt.resumed_from_step > 0
    assert final_digest_of(job) == toy_digest(ENV)
    machine = Machine.objects.get(machine_id=first.machine_id)
    assert machine.offline_returns == 21


def test_a_host_that_does_not_come_back_is_left_after_the_cap_and_destroyed(supervisor, settings):
    settings.HOST_RETURN_CAP_S = 5
    job = submit_costly_to_move(supervisor)
    first = wait_running(job, 1)
    comes_back_quickly(first.machine_id)
    wait_checkpoint(job, attempt=first, above=0)

    supervisor.sandbox.inject(first.instance_id, "reboot-host", "never")

    waiting = wait_event(job, "host_offline")
    assert waiting.data["wait"] is True, waiting.message
    moved = wait_event(job, "host_offline_move")
    assert "move" in moved.message, moved.message
    second = wait_running(job, 2)
    wait_state(job, JobState.SUCCEEDED, timeout=60)

    interruption = Interruption.objects.get(attempt=first)
    assert interruption.cause == "provider_offline"
    assert "did not come back within" in interruption.detail
    # Dated from when the host went offline, not from when the wait gave up.
    assert interruption.detected_at <= moved.created_at
    assert (moved.created_at - interruption.detected_at).total_seconds() >= 4
    assert second.machine_id != first.machine_id
    assert final_digest_of(job) == toy_digest(ENV)
    # The offline instance was destroyed: nothing of it is listed, nothing billed.
    wait_until(
        lambda: first.instance_id not in {i.id for i in live_instances(supervisor.sandbox)},
        timeout=20,
        what="the offline instance to be destroyed",
    )
    debug = supervisor.sandbox.debug(first.instance_id)
    assert debug["destroyed_by"] == "user"
    assert debug["billing_now"] == []
    assert Machine.objects.get(machine_id=first.machine_id).offline_never == 1
