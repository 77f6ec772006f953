"""What the supervisor records when an agent speaks: registration, heartbeats, exit.

The heartbeat is the hot path: authentication reads one row by its token prefix, and the
heartbeat itself is one guarded UPDATE of that row. The guard (``last_seq < seq``) makes a
repeated or out-of-order heartbeat a harmless no-op, and the same update moves the attempt's
``heartbeat_deadline`` so the watchdog finds due attempts with one indexed query.

Job-level transitions (starting → running, recovering, failed) belong to the job state machine;
these functions only record what the agent reported.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Case, F, Q, Value, When

from jobs import checkpoints, losses
from jobs.models import Attempt, AttemptState, LossPoint, loss_sample_every
from jobs.tokens import token_matches, token_prefix
from nomadgpu.storage import object_store

ACTIVE = [AttemptState.STARTING, AttemptState.RUNNING]
LOG_TAIL_LIMIT = 8 * 1024


class TokenUnknown(Exception):
    """No attempt holds this token."""


class TokenDead(Exception):
    """The attempt behind this token has ended: the agent must stop (fencing)."""


class AttemptNotRentedYet(Exception):
    """The agent's instance exists but the supervisor has not recorded it: the create's answer
    was lost and the reconciler adopts the instance by its label shortly. The agent must wait,
    not stop: stopping would leave the adopted host without an agent."""


def authenticate_agent(token: str) -> Attempt:
    """The live attempt holding TOKEN; raises TokenUnknown, AttemptNotRentedYet or TokenDead."""
    attempt = (
        Attempt.objects.select_related("job__team").filter(token_prefix=token_prefix(token)).first()
    )
    if attempt is None or not token_matches(token, attempt.token_digest):
        raise TokenUnknown
    if attempt.state == AttemptState.REQUESTED:
        raise AttemptNotRentedYet
    if attempt.state not in ACTIVE:
        raise TokenDead(attempt.end_reason or attempt.state)
    return attempt


def heartbeat_deadline(attempt: Attempt, now: datetime) -> datetime:
    return now + attempt.job.heartbeat_timeout


def register_agent(attempt: Attempt, *, now: datetime) -> dict:
    """Record the agent's arrival and tell it what to run and where to resume from.

    Idempotent while the attempt lives: an agent restarted in the same container registers
    again and continues its heartbeat sequence above ``heartbeat_seq``.
    """
    job = attempt.job
    resume = resume_instructions(job.pk)
    Attempt.objects.filter(pk=attempt.pk, state__in=ACTIVE).update(
        registered_at=now,
        last_heartbeat_at=now,
        heartbeat_deadline=heartbeat_deadline(attempt, now),
        resumed_from_step=resume["step"] if resume else 0,
    )
    return {
        "job_id": job.pk,
        "attempt_no": attempt.number,
        "heartbeat_seq": max(attempt.last_seq, 0),
        "command": job.command,
        "env": job.env,
        "total_steps": job.total_steps,
        "heartbeat_interval_s": job.heartbeat_interval_s,
        "checkpoint": {"keep_last": job.keep_last, "upload_part_size": checkpoints.PART_SIZE},
        "resume": resume,
        "encryption": _encryption(job),
    }


def _encryption(job) -> dict | None:
    if not job.encrypt_checkpoints:
        return None
    return {"data_key_b64": job.data_key, "format": "ngck1"}


def resume_instructions(job_id: int) -> dict | None:
    checkpoint = checkpoints.newest_ready(job_id)
    if checkpoint is None:
        return None
    store = object_store(checkpoint.attempt.job.team)
    return {
        "checkpoint_id": checkpoint.pk,
        "step": checkpoint.step,
        "encrypted": checkpoint.encrypted,
        "object": {
            "url": store.presign_get(checkpoint.key),
            "size": checkpoint.size,
            "sha256": checkpoint.sha256,
        },
    }


@dataclass(frozen=True)
class Heartbeat:
    seq: int
    phase: str
    step: int | None
    total_steps: int | None
    loss: float | None
    seconds_per_step: float | None
    gpu_ok: bool
    gpu_error: str
    bytes_down: int
    bytes_up: int
    log_tail: str


def record_heartbeat(attempt: Attempt, beat: Heartbeat, *, now: datetime) -> dict:
    """Store BEAT with one guarded update and answer with the command for the agent.

    A GPU fault or a stall pulls the deadline to now, so the watchdog's indexed query of due
    attempts finds it on its next tick; training reported running moves the job to running.
    """
    command = attempt.pending_command or "continue"
    deadline = heartbeat_deadline(attempt, now)
    if not beat.gpu_ok or _stalled(attempt, beat, now):
        deadline = now
    progressed = (
        Q(step__isnull=True) | Q(step__lt=beat.step) if beat.step is not None else Q(pk=None)
    )
    Attempt.objects.filter(pk=attempt.pk, state__in=ACTIVE, last_seq__lt=beat.seq).update(
        last_seq=beat.seq,
        last_heartbeat_at=now,
        heartbeat_deadline=deadline,
        phase=beat.phase,
        last_progress_at=Case(When(progressed, then=Value(now)), default=F("last_progress_at")),
        step=beat.step if beat.step is not None else F("step"),
        total_steps=beat.total_steps if beat.total_steps is not None else F("total_steps"),
        loss=beat.loss if beat.loss is not None else F("loss"),
        seconds_per_step=beat.seconds_per_step,
        gpu_ok=beat.gpu_ok,
        gpu_error=beat.gpu_error[:300],
        bytes_down=beat.bytes_down,
        bytes_up=beat.bytes_up,
        log_tail=beat.log_tail[-LOG_TAIL_LIMIT:],
        # checkpoint_now is delivered once; stop stays until the agent is gone.
        pending_command=Value("") if command == "checkpoint_now" else F("pending_command"),
    )
    if attempt.state == AttemptState.STARTING and beat.phase == "running":
        losses.mark_running(attempt, now=now)
    sample_loss(attempt, beat, now=now)
    return {"command": command, "heartbeat_interval_s": attempt.job.heartbeat_interval_s}


def sample_loss(attempt: Attempt, beat: Heartbeat, *, now: datetime) -> bool:
    """Keep BEAT's loss for the job's chart when its step enters a new sampling bucket.

    ATTEMPT is the row as it was before this beat, so its step is the previous one: most beats
    cost one integer comparison, and a job gets about ``LOSS_POINTS_PER_JOB`` rows in all.
    """
    if beat.loss is None or beat.step is None:
        return False
    every = loss_sample_every(beat.total_steps or attempt.job.total_steps)
    previous = attempt.step
    if previous is not None and beat.step // every <= previous // every:
        return False
    LossPoint.objects.bulk_create(
        [LossPoint(job_id=attempt.job_id, step=beat.step, loss=beat.loss, created_at=now)],
        ignore_conflicts=True,  # a resumed attempt may report a step the old one sampled
    )
    return True


def _stalled(attempt: Attempt, beat: Heartbeat, now: datetime) -> bool:
    """No new step for the job's stall timeout while training (not restoring or uploading)."""
    if beat.phase != "running" or beat.step is None or attempt.step is None:
        return False
    if beat.step > attempt.step:
        return False
    since = attempt.last_progress_at or attempt.running_at
    return since is not None and (now - since).total_seconds() >= attempt.job.stall_timeout_s


def record_exit(
    attempt: Attempt,
    *,
    exit_code: int | None,
    reason: str,
    log_tail: str,
    now: datetime,
    error: str = "",
) -> None:
    """Keep what the agent said about the end of the training process, then end the attempt
    (success finishes the job, a non-zero exit fails it; see ``losses.handle_exit``). A command
    that never started (``agent_error``) or was killed (``killed``) is a lost host instead."""
    Attempt.objects.filter(pk=attempt.pk).update(
        exit_code=exit_code,
        phase="exited",
        log_tail=log_tail[-LOG_TAIL_LIMIT:],
        last_heartbeat_at=now,
    )
    attempt.refresh_from_db()
    if reason == "agent_error":
        # The command never ran (e.g. the checkpoint failed its sha256 on this host): a host
        # problem, not the user's code, so the job moves to another host.
        losses.handle_loss(losses.Loss(attempt.pk, "agent_error", error), now=now)
        return
    if reason == "killed" and exit_code != 0:
        # The agent was told to terminate (docker stop: outbid, host maintenance, a stop from
        # the provider's console) or the command died from a signal it did not send. The
        # command did not exit on its own, so this is the host's doing, not the user's bug.
        how = f"exit code {exit_code}" if exit_code is not None else "a signal"
        detail = f"the command was stopped by the host ({how})"
        losses.handle_loss(losses.Loss(attempt.pk, "killed", detail), now=now)
        return
    losses.handle_exit(attempt, exit_code=exit_code, reason=reason, now=now)


def new_data_key() -> str:
    """A random AES-256 key for one job's checkpoints, base64 for JSON and sealed storage."""
    import os

    return base64.b64encode(os.urandom(32)).decode()
