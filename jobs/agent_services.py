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

from django.db import connection

from jobs import checkpoints, losses
from jobs.models import Attempt, AttemptState, Job, LossPoint, loss_sample_every
from jobs.tokens import token_matches, token_prefix
from nomadgpu.storage import object_store

ACTIVE = [AttemptState.STARTING, AttemptState.RUNNING]
LOG_TAIL_LIMIT = 8 * 1024


# Every agent call authenticates, so the lookup leaves out what most calls never read: the
# team (its sealed secrets cost a decryption each) loads on first use, and so does the job's
# sealed data key (register only).
AUTH_DEFERRED = ("log_tail", "decision", "job__data_key")
# A heartbeat comes every 15 s from every host: its lookup reads only what
# ``record_heartbeat`` reads, with one written-out SELECT (``_heartbeat_lookup``).
HEARTBEAT_ATTEMPT_FIELDS = frozenset(
    {"id", "job_id", "number", "state", "end_reason", "token_digest", "pending_command", "step",
     "last_progress_at", "running_at", "resumed_from_step"}
)  # fmt: skip
HEARTBEAT_JOB_FIELDS = frozenset({"id", "heartbeat_interval_s", "stall_timeout_s", "total_steps"})


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
    reads. Other fields load on first use, one query each."""
    prefix = token_prefix(token)
    if for_heartbeat:
        attempt = _heartbeat_lookup(prefix)
    else:
        attempts = Attempt.objects.select_related("job").defer(*AUTH_DEFERRED)
        attempt = attempts.filter(token_prefix=prefix).order_by().first()
    if attempt is None or not token_matches(token, attempt.token_digest):
        raise TokenUnknown
    if attempt.state == AttemptState.REQUESTED:
        raise AttemptNotRentedYet
    if attempt.state not in ACTIVE:
        raise TokenDead(attempt.end_reason or attempt.state)
    return attempt


def _heartbeat_lookup(prefix: str) -> Attempt | None:
    """The attempt holding PREFIX and its job, with only the heartbeat's fields. Written out:
    the ORM spent more CPU building this query than Postgres spent running it."""
    attempt_fields = _fields(Attempt, HEARTBEAT_ATTEMPT_FIELDS)
    job_fields = _fields(Job, HEARTBEAT_JOB_FIELDS)
    quote = connection.ops.quote_name
    columns = [f"a.{quote(f.column)}" for f in attempt_fields]
    columns += [f"j.{quote(f.column)}" for f in job_fields]
    # Only names from the models go into the text; the prefix is a parameter.
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(Attempt._meta.db_table)} a "  # noqa: S608
        f"JOIN {quote(Job._meta.db_table)} j ON j.id = a.job_id WHERE a.token_prefix = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    values = [_from_db(f, v) for f, v in zip(attempt_fields + job_fields, row, strict=True)]
    split = len(attempt_fields)
    attempt = Attempt.from_db(connection.alias, [f.attname for f in attempt_fields], values[:split])
    attempt.job = Job.from_db(connection.alias, [f.attname for f in job_fields], values[split:])
    return attempt


def _fields(model, names: frozenset[str]) -> list:
    # In the model's field order: Model.from_db fills the fields it is not given in that order.
    return [f for f in model._meta.concrete_fields if f.attname in names]


def _from_db(field, value):
    """VALUE as the ORM would load it for FIELD (e.g. SQLite's datetimes made aware)."""
    col = field.get_col(field.model._meta.db_table)
    for convert in connection.ops.get_db_converters(col) + field.get_db_converters(connection):
        value = convert(value, col, connection)
    return value


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
    # checkpoint_now is delivered once; stop stays until the agent is gone.
    clear = command == "checkpoint_now"
    _store_heartbeat(attempt.pk, beat, now=now, deadline=deadline, clear_command=clear)
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


# The heartbeat's one guarded UPDATE, written out: building it with the ORM (a CASE, three
# COALESCEs) cost more CPU than the rest of the request. A missing step, total or loss keeps
# the stored value; progress is a step above the stored one.
_HEARTBEAT_UPDATE = """
UPDATE {table} SET
    last_seq = %s, last_heartbeat_at = %s, heartbeat_deadline = %s, phase = %s,
    last_progress_at = CASE WHEN %s AND (step IS NULL OR step < %s) THEN %s
                       ELSE last_progress_at END,
    step = COALESCE(%s, step), total_steps = COALESCE(%s, total_steps),
    loss = COALESCE(%s, loss), seconds_per_step = %s, gpu_ok = %s, gpu_error = %s,
    bytes_down = %s, bytes_up = %s, log_tail = %s{clear_command}
WHERE id = %s AND state IN (%s, %s) AND last_seq < %s
"""


def _store_heartbeat(
    attempt_id: int, beat: Heartbeat, *, now: datetime, deadline: datetime, clear_command: bool
) -> None:
    """Write BEAT into the attempt if it is still active and BEAT is newer than the last one."""
    adapt = connection.ops.adapt_datetimefield_value
    sql = _HEARTBEAT_UPDATE.format(
        table=connection.ops.quote_name(Attempt._meta.db_table),
        clear_command=", pending_command = ''" if clear_command else "",
    )
    params = [
        beat.seq,
        adapt(now),
        adapt(deadline),
        beat.phase,
        beat.step is not None,
        beat.step,
        adapt(now),
        beat.step,
        beat.total_steps,
        beat.loss,
        beat.seconds_per_step,
        beat.gpu_ok,
        beat.gpu_error[:300],
        beat.bytes_down,
        beat.bytes_up,
        beat.log_tail[-LOG_TAIL_LIMIT:],
        attempt_id,
        *ACTIVE,
        beat.seq,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


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
