"""What the supervisor records when an agent speaks: registration, heartbeats, exit.

The heartbeat is the hot path: its authentication reads only the fields it needs and its write
is one guarded UPDATE (both in ``heartbeat_store``). The guard (the attempt live, ``last_seq <
seq``) makes a repeated or out-of-order heartbeat a harmless no-op, and the same update moves
the attempt's ``heartbeat_deadline``, which the watchdog compares against the clock.

Job-level transitions (starting → running, recovering, failed) belong to the job state machine;
these functions only record what the agent reported.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from jobs import (
    heartbeat_store,
    lifecycle,
    stall,
)
from jobs.checkpoints import interval as ci
from jobs.checkpoints import records, requests
from jobs.code import job_secrets
from jobs.code.for_agent import agent_workdir
from jobs.heartbeat_store import LOG_TAIL_LIMIT, Heartbeat
from jobs.models import (
    ON_HOST_STATES,
    Attempt,
    AttemptState,
    Checkpoint,
    LossPoint,
    loss_sample_every,
)
from jobs.staging.for_agent import agent_stage
from nomadgpu.storage import object_store
from nomadgpu.tokens import token_matches, token_prefix

# The phase boundaries an agent may report (PROTOCOL.md, ``phases``) and the Attempt field
# each is kept in. A report older than PHASE_AGE_LIMIT_S is dropped as nonsense.
PHASE_FIELDS = {
    "container_started": "container_started_at",
    "deps_ready": "deps_ready_at",
    "workdir_ready": "workdir_ready_at",
    "setup_done": "setup_done_at",
    "stage_done": "stage_done_at",
    "restore_downloaded": "restore_downloaded_at",
    "restore_unpacked": "restore_unpacked_at",
    "command_started": "command_started_at",
    "first_step": "first_step_at",
}
PHASE_AGE_LIMIT_S = 7 * 86400
MAX_GPUS = 16  # a heartbeat's GPUs at most: as many as a job may ask for (jobs.spec)


# Every agent call authenticates, so the lookup leaves out what most calls never read: the
# team (its sealed secrets cost a decryption each) loads on first use, and so does the job's
# sealed data key (register only). A heartbeat reads even less (``heartbeat_store``).
AUTH_DEFERRED = ("log_tail", "decision", "job__data_key")


class TokenUnknown(Exception):
    """No attempt holds this token."""


class TokenDead(Exception):
    """The attempt behind this token has ended: the agent must stop (fencing)."""


class AttemptNotRentedYet(Exception):
    """The agent's instance exists but the supervisor has not recorded it: the create's answer
    was lost and the reconciler adopts the instance by its label shortly. The agent must wait,
    not stop: stopping would leave the adopted host without an agent."""


def authenticate_agent(token: str, *, for_heartbeat: bool = False) -> Attempt:
    """The live attempt holding TOKEN; raises TokenUnknown, AttemptNotRentedYet or TokenDead.

    Loaded: everything but ``AUTH_DEFERRED``, or with FOR_HEARTBEAT only what a heartbeat
    reads (``heartbeat_store.load_for_heartbeat``). Other fields load on first use, one query
    each."""
    prefix = token_prefix(token)
    if for_heartbeat:
        attempt = heartbeat_store.load_for_heartbeat(prefix)
    else:
        attempts = Attempt.objects.select_related("job").defer(*AUTH_DEFERRED)
        attempt = attempts.filter(token_prefix=prefix).order_by().first()
    return _token_checked(attempt, token)


def heartbeat_deadline(attempt: Attempt, now: datetime) -> datetime:
    return now + attempt.job.heartbeat_timeout


def _token_checked(attempt: Attempt | None, token: str) -> Attempt:
    """ATTEMPT if TOKEN is its token and it is live; raises TokenUnknown, AttemptNotRentedYet or
    TokenDead otherwise (what the agent API answers 401, 503 and 410)."""
    if attempt is None or not token_matches(token, attempt.token_digest):
        raise TokenUnknown
    if attempt.state == AttemptState.REQUESTED:
        raise AttemptNotRentedYet
    if attempt.state not in ON_HOST_STATES:
        raise TokenDead(attempt.end_reason or attempt.state)
    return attempt


def register_agent(
    attempt: Attempt, *, now: datetime, phases: dict[str, float] | None = None
) -> dict:
    """Record the agent's arrival and tell it what to run, where to resume from and whether the
    supervisor chooses when to checkpoint (``checkpoint.mode``).

    Idempotent while the attempt lives: an agent restarted in the same container registers
    again (its heartbeats' ``seq`` continue above the old ones by the clock, see PROTOCOL.md).
    PHASES (seconds before now, by name) may say when the container came up and the agent's
    dependencies were ready; the first call stands in for whichever is not said.
    """
    job = attempt.job
    resume = resume_instructions(job.pk)
    ages = {"deps_ready": 0.0, **(phases or {})}
    ages.setdefault("container_started", ages["deps_ready"])
    Attempt.objects.filter(pk=attempt.pk, state__in=ON_HOST_STATES).update(
        # The first registration is when the GPU's billing began (billing.spend): an agent
        # restarted in the same container must not move it.
        registered_at=Coalesce(F("registered_at"), Value(now, output_field=DateTimeField())),
        last_heartbeat_at=now,
        heartbeat_deadline=heartbeat_deadline(attempt, now),
        resumed_from_step=resume["step"] if resume else 0,
        **_first_reports(ages, now),
    )
    return {
        "job_id": job.pk,
        "attempt_no": attempt.number,
        "command": job.command,
        # Several GPUs (PROTOCOL.md "Launchers"): the launcher the agent wraps the command in;
        # it starts one process per GPU of num_gpus below.
        "launcher": job.launcher or None,
        "env": job.env,
        "total_steps": job.total_steps,
        "heartbeat_interval_s": job.heartbeat_interval_s,
        # The GPUs the job has on its host (selection matches the offer's count exactly):
        # fewer visible to nvidia-smi is a GPU fault (PROTOCOL.md, ``gpu``), and a launcher
        # starts one process per GPU.
        "num_gpus": job_gpu_count(job),
        "checkpoint": {
            "keep_last": job.keep_last,
            "upload_part_size": records.PART_SIZE,
            "mode": ci.AUTO if requests.is_auto(job) else ci.SCRIPT,
        },
        "resume": resume,
        "encryption": _encryption(job),
        # The job's code (PROTOCOL.md, ``workdir``); raises packs.PackUnavailable.
        "workdir": agent_workdir(job),
        # The staged model files (PROTOCOL.md, ``stage``), laid out before the setup.
        "stage": agent_stage(job),
        # The one place a secret's value leaves the server for a host (jobs.code.job_secrets).
        "setup": job.setup,
        "secrets": job_secrets.register_secrets(job),
    }


def job_gpu_count(job) -> int:
    """The job's ``requirements.num_gpus`` (1 when unset, or not a number after a hand edit)."""
    return max(1, job.gpu_count())


def _encryption(job) -> dict | None:
    if not job.encrypt_checkpoints:
        return None
    return {"data_key_b64": job.data_key, "format": "ngck1"}


def resume_instructions(job_id: int) -> dict | None:
    checkpoint = Checkpoint.objects.filter(job_id=job_id).select_related("attempt").newest_ready()
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


def record_phases(attempt_id: int, ages: dict[str, float], *, now: datetime) -> None:
    """Keep the phase boundaries AGES reports (seconds before NOW, by name) on the attempt;
    a boundary already known keeps its first report (an agent resends until answered, and a
    restarted agent's repeats must not move it)."""
    fields = _first_reports(ages, now)
    if fields:
        Attempt.objects.filter(pk=attempt_id, state__in=ON_HOST_STATES).update(**fields)


def _first_reports(ages: dict[str, float], now: datetime) -> dict:
    """UPDATE expressions that set each named boundary to NOW - age unless already set."""
    return {
        PHASE_FIELDS[name]: Coalesce(
            F(PHASE_FIELDS[name]),
            Value(now - timedelta(seconds=age), output_field=DateTimeField()),
        )
        for name, age in ages.items()
        if name in PHASE_FIELDS
    }


def record_heartbeat(attempt: Attempt, beat: Heartbeat, *, now: datetime) -> dict:
    """Store BEAT for ATTEMPT (authenticated, loaded as ``heartbeat_store.load_for_heartbeat``
    loads it) and answer with the command for the agent.

    A GPU fault pulls the watchdog's deadline to now, so its next tick ends the attempt."""
    deadline = heartbeat_deadline(attempt, now) if beat.gpu_ok else now
    stored = heartbeat_store.store_heartbeat(attempt, beat, now=now, deadline=deadline)
    return _after_store(attempt, beat, stored=stored, now=now)


def _after_store(attempt: Attempt, beat: Heartbeat, *, stored: bool, now: datetime) -> dict:
    """The rest of a heartbeat, decided on ATTEMPT as it was before BEAT: a stall pulls the
    deadline to now (the watchdog's next tick finds it), training reported running moves the
    job to running, and the loss may be sampled. A stale or repeated beat (not STORED) only
    gets its answer."""
    if stored:
        if _stalled(attempt, beat, now):
            Attempt.objects.filter(pk=attempt.pk, state__in=ON_HOST_STATES).update(
                heartbeat_deadline=now
            )
        if attempt.step is None and beat.step is not None:
            # The first step on this host (an agent that does not report ``first_step``
            # itself is timed by its heartbeat: up to one interval late).
            record_phases(attempt.pk, {"first_step": 0.0}, now=now)
        if attempt.state == AttemptState.STARTING and beat.phase == "running":
            lifecycle.mark_running(attempt, now=now)
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
    (success finishes the job, a non-zero exit fails it; see ``lifecycle.handle_exit``). A command
    that never started (``agent_error``) or was killed (``killed``) is a lost host instead; a
    setup that failed (``setup_failed``) is the job's own error, like a failed command.

    The log tail kept here is the attempt's last word (events and notifications quote it), so
    the job's secret values are masked in it again, whatever the agent did."""
    Attempt.objects.filter(pk=attempt.pk).update(
        exit_code=exit_code,
        phase="exited",
        log_tail=job_secrets.mask_for(attempt.job, log_tail[-LOG_TAIL_LIMIT:]),
        last_heartbeat_at=now,
    )
    attempt.refresh_from_db()
    if reason == "agent_error":
        # The command never ran (e.g. the checkpoint failed its sha256 on this host): a host
        # problem, not the user's code, so the job moves to another host.
        lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "agent_error", error), now=now)
        return
    if reason == "killed" and exit_code != 0:
        # The agent was told to terminate (docker stop: outbid, host maintenance, a stop from
        # the provider's console) or the command died from a signal it did not send. The
        # command did not exit on its own, so this is the host's doing, not the user's bug.
        how = f"exit code {exit_code}" if exit_code is not None else "a signal"
        detail = f"the command was stopped by the host ({how})"
        lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "killed", detail), now=now)
        return
    lifecycle.handle_exit(attempt, exit_code=exit_code, reason=reason, now=now, error=error)


def fail_without_code(attempt: Attempt, *, why: str, now: datetime) -> None:
    """ATTEMPT's job cannot get its code (its pack is gone): no host can run it, so the job
    fails with WHY and what to do, and its machine is released. Not a host loss."""
    reason = f"{why}: submit the job again with its code"
    lifecycle.fail_job(attempt.job_id, why=reason, now=now)
