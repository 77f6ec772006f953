"""The field report's experiment on the sandbox: a host destroyed halfway, and the job resumes
from its newest checkpoint on a new host and finishes with the same weights."""

from __future__ import annotations

import itertools

import pytest

from jobs import anatomy
from jobs.models import Attempt, Checkpoint, Interruption, JobState
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def state_of(job) -> str:
    job.refresh_from_db()
    return job.state


def running_attempt(job) -> Attempt | None:
    return job.attempts.filter(state="running").first()


def test_a_host_destroyed_halfway_resumes_from_the_newest_checkpoint(
    supervisor, uninterrupted_digest
):
    # Beats every 3 s: the provider's listing (polled every second here) says "offline" before
    # the heartbeat's 5.25 s of silence could, so the cause asserted below is never a race.
    job = supervisor.submit_toy(heartbeat_interval_s=3)
    wait_until(lambda: running_attempt(job), timeout=90, what="the toy job to run")
    wait_until(
        lambda: Checkpoint.objects.filter(job=job, state="ready", step__gte=150).exists(),
        timeout=90,
        what="a ready checkpoint at step 150",
    )
    first = running_attempt(job)
    newest_before = Checkpoint.objects.filter(job=job, state="ready").order_by("-step").first()

    supervisor.sandbox.inject(first.instance_id, "destroy")

    wait_until(lambda: state_of(job) == JobState.SUCCEEDED, timeout=180, what="the job to finish")
    interruption = Interruption.objects.get(attempt=first)
    last = job.attempts.order_by("-number").first()
    assert interruption.cause == "provider_offline"  # the host vanished: listed offline
    assert interruption.resumed_step >= newest_before.step > 0
    assert interruption.running_again_at > interruption.replacement_rented_at
    assert last.number == 2
    assert f"final-digest: {uninterrupted_digest}" in last.log_tail
    assert supervisor.sandbox.status(first.instance_id) is None  # nothing left billing
    assert job.events.filter(kind="host_lost").count() == 1
    assert job.events.filter(kind="running_again").count() == 1
    # The recovery's anatomy: the bootstrap and the agent reported every boundary, in order
    # (the bootstrap's are whole seconds; the agent's differ by their calls' latency at most).
    assert interruption.replacement == last
    moments = [
        last.container_started_at,
        last.deps_ready_at,
        last.restore_downloaded_at,
        last.restore_unpacked_at,
        last.command_started_at,
        last.first_step_at,
    ]
    assert None not in moments
    assert all((b - a).total_seconds() > -1 for a, b in itertools.pairwise(moments))
    split = anatomy.breakdown(interruption)
    assert None not in split["phases"].values()
    # The last heartbeat's step may lag the checkpoint it resumed from: nothing redone then.
    redone = interruption.step_reached - interruption.resumed_step
    assert split["lost_work"]["steps"] == max(redone, 0)
