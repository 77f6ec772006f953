"""Waiting for a job in the database (never sleep-and-assert): a state, a running attempt, a
ready checkpoint, a detected loss. Each polls with ``wait_until`` and a deadline; one that times
out says what the job went through meanwhile (its events and attempts), so a failure on a loaded
CI machine names its cause instead of only its symptom."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from jobs import lifecycle
from jobs.models import Attempt, AttemptState, Checkpoint, Interruption, Job
from tests.support.processes import wait_until

T = TypeVar("T")


def story_of(job_id: int) -> str:
    """What job JOB_ID went through, for a failure message: its events and attempts in order."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return f"job {job_id} is gone"
    events = [
        f"  {e.created_at:%H:%M:%S.%f} {e.kind}: {e.message}" for e in job.events.order_by("pk")
    ]
    attempts = [
        f"  attempt {a.number}: {a.state} {a.end_reason or ''} registered {a.registered_at} "
        f"last beat {a.last_heartbeat_at} deadline {a.heartbeat_deadline} ended {a.ended_at}"
        for a in job.attempts.order_by("number")
    ]
    return "\n".join([f"job {job_id} ({job.state}) events:", *events, "attempts:", *attempts])


def explained(job_id: int, wait: Callable[[], T]) -> T:
    """WAIT, and on a timeout the failure says what the job went through (``story_of``)."""
    try:
        return wait()
    except pytest.fail.Exception as failed:
        pytest.fail(f"{failed}\n{story_of(job_id)}")


def state_of(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def wait_state(job: Job, *states: str, timeout: float = 90) -> str:
    """Wait until JOB is in one of STATES; fail early if it ends in another terminal state."""

    def reached() -> str | None:
        state = state_of(job)
        if state in states:
            return state
        if lifecycle.is_terminal(state):
            pytest.fail(f"job {job.pk} ended {state} ({job.failure_reason}), wanted {states}")
        return None

    what = f"job {job.pk} to be {'/'.join(states)}"
    return explained(job.pk, lambda: wait_until(reached, timeout=timeout, what=what))


def running_attempt(job: Job, number: int | None = None) -> Attempt | None:
    attempts = job.attempts.filter(state=AttemptState.RUNNING)
    if number is not None:
        attempts = attempts.filter(number=number)
    return attempts.first()


def wait_running(job: Job, number: int | None = None, timeout: float = 60) -> Attempt:
    """Wait until JOB trains on a host (attempt NUMBER, when given)."""
    what = f"job {job.pk} to run" + (f" attempt {number}" if number else "")
    return explained(
        job.pk,
        lambda: wait_until(lambda: running_attempt(job, number), timeout=timeout, what=what),
    )


def wait_checkpoint(job: Job, *, attempt: Attempt | None = None, above: int = 0) -> Checkpoint:
    """Wait for a ready checkpoint of JOB (of ATTEMPT, when given) at a step above ABOVE."""
    found = Checkpoint.objects.filter(job=job, state="ready", step__gt=above)
    if attempt is not None:
        found = found.filter(attempt=attempt)
    what = f"a ready checkpoint of job {job.pk} above step {above}"
    return explained(
        job.pk, lambda: wait_until(lambda: found.order_by("-step").first(), timeout=60, what=what)
    )


def wait_interruption(attempt: Attempt, timeout: float = 60) -> Interruption:
    what = f"the loss of attempt {attempt.number} of job {attempt.job_id} to be detected"
    return explained(
        attempt.job_id,
        lambda: wait_until(
            lambda: Interruption.objects.filter(attempt=attempt).first(), timeout=timeout, what=what
        ),
    )
