"""The fire drill: destroy a job's host on purpose and time the recovery (the field report's
experiment). Works against the sandbox and against real Vast: it only calls destroy.

A drill is not an interruption of the team's service: ``destroy_running_host`` marks the
attempt before it destroys the host, ``lifecycle.handle_loss`` records that loss as a drill,
and the status page, its badge and every rate a decision uses leave drills out. The job's
timeline keeps it ("fire drill: host lost as planned ...")."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.utils import timezone

from hosts.vast import VastClient
from jobs import anatomy, lifecycle
from jobs.models import Attempt, AttemptState, Interruption, Job
from jobs.recovery_times import recovery_times, seconds_between


@dataclass(frozen=True)
class DrillResult:
    """One drill's recovery: every figure counts from the loss (``jobs.recovery_times``)."""

    job_id: int
    destroyed_instance: int
    detection_s: float | None  # the loss (last heartbeat) → detected
    back_on_machine_s: float | None
    training_again_s: float | None
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
    ``drill`` event on the timeline; returns the attempt, marked as drilled (its loss is
    recorded as a drill). Raises DrillError when nothing runs or the instance was already
    gone; the provider's errors (VastError) pass on."""
    attempt = running_attempt(job)
    # Marked first: the watchdog may find the loss as soon as the instance is gone, and must
    # then already see a drill (inside a caller's transaction the mark also holds the row,
    # so the watchdog's close waits for it). A destroy that did not happen takes it back: a
    # later loss of this host is a real one.
    Attempt.objects.filter(pk=attempt.pk).update(drilled_at=timezone.now())
    try:
        with VastClient.from_settings(job.team) as client:
            destroyed = client.destroy_instance(attempt.instance_id)
    except BaseException:
        Attempt.objects.filter(pk=attempt.pk).update(drilled_at=None)
        raise
    if not destroyed:
        Attempt.objects.filter(pk=attempt.pk).update(drilled_at=None)
        raise DrillError(
            f"instance {attempt.instance_id} of job {job.pk} was already gone at the provider: "
            "a real loss, not a drill; the supervisor recovers it as one"
        )
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
    """Destroy the job's running host and wait until it is training again elsewhere."""
    attempt = destroy_running_host(job, by="by manage.py drill")
    say(f"destroyed instance {attempt.instance_id} of job {job.pk}{step_words(attempt.step)}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        interruption = Interruption.objects.filter(attempt=attempt).first()
        if interruption and interruption.training_again_at:
            return _result(job, attempt, interruption)
        job.refresh_from_db()
        if job.state in ("failed", "cancelled", "succeeded"):
            raise DrillError(f"job {job.pk} ended ({job.state}) before training again")
        time.sleep(poll_s)
    raise DrillError(f"job {job.pk} was not training again within {timeout_s:.0f} s")


def _result(job, attempt, interruption: Interruption) -> DrillResult:
    times = recovery_times(interruption)
    return DrillResult(
        job_id=job.pk,
        destroyed_instance=attempt.instance_id,
        detection_s=seconds_between(times.lost_at, interruption.detected_at),
        back_on_machine_s=times.back_on_machine_s,
        training_again_s=times.training_again_s,
        resumed_step=interruption.resumed_step,
        resume_note=anatomy.resume_note(interruption.step_reached, interruption.resumed_step),
    )
