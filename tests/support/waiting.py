"""Waiting for a job in the database (never sleep-and-assert): a state, a running attempt, a
ready checkpoint, a detected loss. Each polls with ``wait_until`` and a deadline."""

from __future__ import annotations

import pytest

from jobs import lifecycle
from jobs.models import Attempt, AttemptState, Checkpoint, Interruption, Job
from tests.support.processes import wait_until


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

    return wait_until(reached, timeout=timeout, what=f"job {job.pk} to be {'/'.join(states)}")


def running_attempt(job: Job, number: int | None = None) -> Attempt | None:
    attempts = job.attempts.filter(state=AttemptState.RUNNING)
    if number is not None:
        attempts = attempts.filter(number=number)
    return attempts.first()


def wait_running(job: Job, number: int | None = None, timeout: float = 60) -> Attempt:
    """Wait until JOB trains on a host (attempt NUMBER, when given)."""
    return wait_until(
        lambda: running_attempt(job, number),
        timeout=timeout,
        what=f"job {job.pk} to run" + (f" attempt {number}" if number else ""),
    )


def wait_checkpoint(job: Job, *, attempt: Attempt | None = None, above: int = 0) -> Checkpoint:
    """Wait for a ready checkpoint of JOB (of ATTEMPT, when given) at a step above ABOVE."""
    found = Checkpoint.objects.filter(job=job, state="ready", step__gt=above)
    if attempt is not None:
        found = found.filter(attempt=attempt)
    return wait_until(
        lambda: found.order_by("-step").first(),
        timeout=60,
        what=f"a ready checkpoint of job {job.pk} above step {above}",
    )


def wait_interruption(attempt: Attempt, timeout: float = 60) -> Interruption:
    return wait_until(
        lambda: Interruption.objects.filter(attempt=attempt).first(),
        timeout=timeout,
        what=f"the loss of attempt {attempt.number} of job {attempt.job_id} to be detected",
    )
