"""The fire drill: destroy a job's host on purpose and time the recovery (the field report's
experiment). Works against the sandbox and against real Vast: it only calls destroy."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.utils import timezone

from hosts.vast import VastClient
from jobs import anatomy, lifecycle
from jobs.models import Attempt, AttemptState, Interruption, Job


@dataclass(frozen=True)
class DrillResult:
    job_id: int
    destroyed_instance: int
    detection_s: float | None
    rented_s: float | None
    running_again_s: float | None
    resumed_step: int | None
    resume_note: str  # the step resumed from against the last heartbeat's (anatomy.resume_note)


class DrillError(Exception):
    """The drill could not run or did not finish; the message says what to check."""


def running_attempt(job: Job) -> Attempt:
    attempt = job.attempts.filter(state=AttemptState.RUNNING).first()
    if attempt is None or attempt.instance_id is None:
        raise DrillError(f"job {job.pk} has no running host to destroy (state {job.state})")
    return attempt


def step_words(step: int | None) -> str:
    """Where the destroyed host had got to: " at step 48 (its last heartbeat)", or " before its
    first step" when no heartbeat reported one yet (never "at step None")."""
    return " before its first step" if step is None else f" at step {step} (its last heartbeat)"


def destroy_running_host(job: Job, *, by: str = "") -> Attempt:
    """Destroy the instance under JOB's running attempt, the way a host dies, and put a
    ``drill`` event on the timeline; returns the attempt. Raises DrillError when nothing runs;
    the provider's errors (VastError) pass on."""
    attempt = running_attempt(job)
    with VastClient.from_settings(job.team) as client:
        client.destroy_instance(attempt.instance_id)
    lifecycle.record_event(
        job.pk,
        now=timezone.now(),
        kind="drill",
        message=f"fire drill: instance {attempt.instance_id} destroyed {by}".rstrip()
        + step_words(attempt.step),
        attempt=attempt.number,
        instance_id=attempt.instance_id,
    )
    return attempt


def drill_once(
    job: Job, *, timeout_s: float = 900, poll_s: float = 0.5, say: Callable[[str], None] = print
) -> DrillResult:
    """Destroy the job's running host and wait until training runs again elsewhere."""
    attempt = destroy_running_host(job, by="by manage.py drill")
    destroyed_at = timezone.now()
    say(f"destroyed instance {attempt.instance_id} of job {job.pk}{step_words(attempt.step)}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        interruption = Interruption.objects.filter(attempt=attempt).first()
        if interruption and interruption.running_again_at:
            return _result(job, attempt, interruption, destroyed_at)
        job.refresh_from_db()
        if job.state in ("failed", "cancelled", "succeeded"):
            raise DrillError(f"job {job.pk} ended ({job.state}) before running again")
        time.sleep(poll_s)
    raise DrillError(f"job {job.pk} did not run again within {timeout_s:.0f} s")


def _result(job, attempt, interruption: Interruption, destroyed_at) -> DrillResult:
    def since(moment):
        return None if moment is None else (moment - destroyed_at).total_seconds()

    return DrillResult(
        job_id=job.pk,
        destroyed_instance=attempt.instance_id,
        detection_s=since(interruption.detected_at),
        rented_s=since(interruption.replacement_rented_at),
        running_again_s=since(interruption.running_again_at),
        resumed_step=interruption.resumed_step,
        resume_note=anatomy.resume_note(interruption.step_reached, interruption.resumed_step),
    )
