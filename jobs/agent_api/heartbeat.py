"""What a heartbeat records and what it is answered.

The heartbeat is the hot path: its authentication reads only the fields it needs and its write
is one guarded UPDATE (both in ``heartbeat_store``). The guard (the attempt live, ``last_seq <
seq``) makes a repeated or out-of-order heartbeat a harmless no-op, and the same update moves
the attempt's ``heartbeat_deadline``, which the watchdog compares against the clock.
"""

from __future__ import annotations

from datetime import datetime

from jobs import lifecycle
from jobs.agent_api import early_progress, heartbeat_store
from jobs.agent_api.heartbeat_store import Heartbeat
from jobs.agent_api.phases import record_phases
from jobs.models import ON_HOST_STATES, Attempt, AttemptState, LossPoint, loss_sample_every
from jobs.watchdog import stall

MAX_GPUS = 16  # a heartbeat's GPUs at most: as many as a job may ask for (jobs.spec)


def heartbeat_deadline(attempt: Attempt, now: datetime) -> datetime:
    return now + attempt.job.heartbeat_timeout


def record_heartbeat(attempt: Attempt, beat: Heartbeat, *, now: datetime) -> dict:
    """Store BEAT for ATTEMPT (authenticated, loaded as ``heartbeat_store.load_for_heartbeat``
    loads it) and answer with the command for the agent.

    A GPU fault pulls the watchdog's deadline to now, so its next tick ends the attempt; an
    early phase's bytes (before the command) keep it no later than that phase's stall
    deadline (``early_progress``)."""
    early = None
    if beat.phase_progress and beat.phase == "restoring":
        early = early_progress.judge_early(attempt, beat.phase_progress, now=now)
    deadline = heartbeat_deadline(attempt, now) if beat.gpu_ok else now
    if early is not None and early.due is not None:
        deadline = min(deadline, early.due.at)
    stored = heartbeat_store.store_heartbeat(attempt, beat, now=now, deadline=deadline)
    if stored and early is not None:
        early_progress.store_early(attempt.pk, early)
    return _after_store(attempt, beat, stored=stored, now=now)


def _after_store(attempt: Attempt, beat: Heartbeat, *, stored: bool, now: datetime) -> dict:
    """The rest of a heartbeat, decided on ATTEMPT as it was before BEAT: a stall pulls the
    deadline to now (the watchdog's next tick finds it), training reported running moves the
    job to running, its first step after a loss makes it training again, and the loss may be
    sampled. A stale or repeated beat (not STORED) only
    gets its answer."""
    if stored:
        if _stalled(attempt, beat, now):
            Attempt.objects.filter(pk=attempt.pk, state__in=ON_HOST_STATES).update(
                heartbeat_deadline=now
            )
        first_step = attempt.step is None and beat.step is not None
        if first_step:
            # The first step on this host (an agent that does not report ``first_step``
            # itself is timed by its heartbeat: up to one interval late).
            record_phases(attempt.pk, {"first_step": 0.0}, now=now)
        if attempt.state == AttemptState.STARTING and beat.phase == "running":
            lifecycle.mark_running(attempt, now=now)
        if first_step:  # after a loss, the job is training again from it
            lifecycle.mark_training_again(attempt.pk, now=now)
        sample_loss(attempt, beat, now=now)
    # checkpoint_now is delivered once (the store cleared it); stop stays until the agent is gone.
    command = attempt.pending_command or "continue"
    return {"command": command, "heartbeat_interval_s": attempt.job.heartbeat_interval_s}


def _stalled(attempt: Attempt, beat: Heartbeat, now: datetime) -> bool:
    return stall.is_stalled(
        phase=beat.phase,
        step_before=attempt.step,
        step_now=beat.step,
        last_progress_at=attempt.last_progress_at,
        running_at=attempt.running_at,
        stall_timeout_s=attempt.job.stall_timeout_s,
        now=now,
    )


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
