"""What happens when an attempt ends: a lost host, the training running (again), the command's
exit, a cancel. Each is one transaction that closes the attempt with a guarded update (which
also kills its token: the agent gets 410 from then on) and moves the job through
``services.transition``; destroying the instance happens after commit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F

from hosts.models import Machine
from jobs import services
from jobs.models import Attempt, AttemptState, Interruption, Job, JobState

ACTIVE = [AttemptState.STARTING, AttemptState.RUNNING]


@dataclass(frozen=True)
class Loss:
    """An attempt whose host is lost, and why (the cause names one of the loss conditions)."""

    attempt_id: int
    cause: str
    detail: str = ""


def close_attempt(attempt_id: int, *, reason: str, now: datetime, states=None) -> Attempt | None:
    """Guarded close: the attempt if this call ended it, None if it had already ended."""
    from jobs import tasks

    states = states or [*ACTIVE, AttemptState.PLANNED, AttemptState.REQUESTED]
    claimed = Attempt.objects.filter(pk=attempt_id, state__in=states).update(
        state=AttemptState.ENDED, end_reason=reason[:40], ended_at=now, pending_command=""
    )
    if not claimed:
        return None
    attempt = Attempt.objects.select_related("job").get(pk=attempt_id)
    if attempt.instance_id is not None:
        services.after_commit(
            tasks.destroy_instance.delay, attempt.job.team_id, attempt.instance_id
        )
    return attempt


def handle_loss(loss, *, now: datetime) -> bool:
    """The host of LOSS.attempt_id is lost: record it, release it, and ask for a replacement."""
    with transaction.atomic():
        attempt = close_attempt(loss.attempt_id, reason=loss.cause, now=now, states=ACTIVE)
        if attempt is None:
            return False
        last_ready = services.newest_ready_step(attempt.job_id)
        Interruption.objects.create(
            job_id=attempt.job_id,
            attempt=attempt,
            cause=loss.cause,
            detail=loss.detail[:300],
            last_heartbeat_at=attempt.last_heartbeat_at,
            detected_at=now,
            step_reached=attempt.step,
        )
        remember_bad_machine(attempt)
        services.transition(
            attempt.job_id,
            JobState.RECOVERING,
            now=now,
            kind="host_lost",
            message=f"host lost ({loss.cause}) "
            + (f"at step {attempt.step}" if attempt.step is not None else "before training began")
            + (f"; resumes from checkpoint {last_ready}" if last_ready else "; no checkpoint yet"),
            data={"cause": loss.cause, "step": attempt.step, "last_checkpoint": last_ready},
        )
    return True


def move_before_contract_end(attempt_id: int, *, now: datetime) -> bool:
    """A planned move, not a loss: end the attempt before its host's contract runs out (no
    ``Interruption``: nothing went wrong), keep the job off that host, and ask for another. The
    job resumes from its newest checkpoint, as after a loss."""
    with transaction.atomic():
        attempt = close_attempt(
            attempt_id, reason="contract_expiring", now=now, states=[AttemptState.RUNNING]
        )
        if attempt is None:
            return False
        last_ready = services.newest_ready_step(attempt.job_id)
        avoid_machine(attempt)
        ends_at = attempt.contract_ends_at
        ends = f"{ends_at:%Y-%m-%d %H:%M} UTC" if ends_at else "soon"
        services.transition(
            attempt.job_id,
            JobState.RECOVERING,
            now=now,
            kind="planned_move",
            message=f"moved off its host before the contract ends ({ends}) at step "
            f"{attempt.step}; resumes from checkpoint {last_ready}",
            data={"step": attempt.step, "last_checkpoint": last_ready},
        )
    return True


def avoid_machine(attempt: Attempt) -> None:
    """Keep ATTEMPT's job off ATTEMPT's machine from now on."""
    if attempt.machine_id is None:
        return
    job = Job.objects.select_for_update().get(pk=attempt.job_id)
    if attempt.machine_id not in job.avoid_machine_ids:
        Job.objects.filter(pk=job.pk).update(
            avoid_machine_ids=[*job.avoid_machine_ids, attempt.machine_id]
        )


def remember_bad_machine(attempt: Attempt) -> None:
    """Avoid this machine for this job, and count it against the machine for every job."""
    if attempt.machine_id is None:
        return
    avoid_machine(attempt)
    Machine.objects.filter(machine_id=attempt.machine_id).update(
        interruptions=F("interruptions") + 1
    )


def mark_running(attempt: Attempt, *, now: datetime) -> None:
    """The agent reports training running: the job runs (again); open interruptions close."""
    with transaction.atomic():
        claimed = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STARTING).update(
            state=AttemptState.RUNNING, running_at=now
        )
        if not claimed:
            return
        still_open = Interruption.objects.filter(
            job_id=attempt.job_id, running_again_at=None, cancelled_before_recovery=False
        )
        open_interruption = still_open.order_by("detected_at").first()
        kind, message = "running", "training started"
        if open_interruption is not None:
            # A replacement lost before it ran leaves its predecessor's interruption open too:
            # the job is back for all of them now, so all close (none stays open forever).
            still_open.update(running_again_at=now, resumed_step=attempt.resumed_from_step or 0)
            downtime = (now - open_interruption.detected_at).total_seconds()
            kind = "running_again"
            resumed = attempt.resumed_from_step or 0
            message = f"running again after {downtime:.0f} s, resumed from step {resumed}"
        services.transition(attempt.job_id, JobState.RUNNING, now=now, kind=kind, message=message)


def handle_exit(attempt: Attempt, *, exit_code: int | None, reason: str, now: datetime) -> None:
    """The training command ended. Success finishes the job; a non-zero exit is the user's bug:
    the job fails and nothing is re-rented (moving hosts does not fix code), unless the job
    allows ``max_script_retries`` more runs: then it restarts from its newest checkpoint."""
    with transaction.atomic():
        closed = close_attempt(attempt.pk, reason=f"exit {exit_code}", now=now, states=ACTIVE)
        if closed is None or reason == "stopped":
            return
        Attempt.objects.filter(pk=closed.pk).update(exit_code=exit_code)
        if exit_code == 0:
            services.transition(
                attempt.job_id,
                JobState.SUCCEEDED,
                now=now,
                kind="finished",
                message=f"finished at step {closed.step}",
                final_step=closed.step,
                finished_at=now,
            )
        elif script_retries_left(closed.job) > 0:
            services.transition(
                attempt.job_id,
                JobState.RECOVERING,
                now=now,
                kind="script_retry",
                message=f"the training command exited with {exit_code}; running it again",
                data={"exit_code": exit_code, "log_tail": closed.log_tail[-2000:]},
            )
        else:
            services.transition(
                attempt.job_id,
                JobState.FAILED,
                now=now,
                kind="failed",
                message=f"the training command exited with {exit_code}",
                data={"exit_code": exit_code, "log_tail": closed.log_tail[-2000:]},
                failure_reason=f"exit code {exit_code}",
                finished_at=now,
            )


def script_retries_left(job: Job) -> int:
    """How many more times a failing command may run (failed exits so far vs the job's cap)."""
    failed_exits = (
        Attempt.objects.filter(job=job, end_reason__startswith="exit ")
        .exclude(exit_code=None)
        .exclude(exit_code=0)
        .count()
    )
    return job.max_script_retries + 1 - failed_exits


def cancel_job(job_id: int, *, now: datetime, by: str = "") -> None:
    """Stop a job for good: release its machine, keep its checkpoints."""
    release_job(
        job_id,
        to=JobState.CANCELLED,
        now=now,
        kind="cancelled",
        message=f"cancelled {by}".strip(),
        reason="cancelled",
        finished_at=now,
    )


def release_job(
    job_id: int,
    *,
    to: str,
    now: datetime,
    kind: str,
    message: str,
    reason: str,
    data: dict | None = None,
    **fields,
) -> None:
    """Move JOB_ID to TO and release its machine (cancel, budget pause): the guarded transition
    first, then every live attempt closed (its instance destroyed after commit). Checkpoints are
    kept; an interruption still open ends here, not with a recovery."""
    with transaction.atomic():
        services.transition(job_id, to, now=now, kind=kind, message=message, data=data, **fields)
        for attempt_id in Attempt.objects.filter(
            job_id=job_id, state__in=[*ACTIVE, AttemptState.PLANNED, AttemptState.REQUESTED]
        ).values_list("pk", flat=True):
            close_attempt(attempt_id, reason=reason, now=now)
        if to == JobState.CANCELLED:
            # A budget pause leaves it open: the job resumes later and the interruption then
            # closes as a recovery (a long one), which is what the status page should count.
            Interruption.objects.filter(job_id=job_id, running_again_at=None).update(
                cancelled_before_recovery=True
            )
