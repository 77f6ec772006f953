"""What the supervisor records when an agent speaks: registration, heartbeats, exit.

The heartbeat is the hot path (``heartbeat``): on PostgreSQL one statement reads the attempt by
its token prefix and writes the beat, guarded by the token's digest, the attempt being live and
``last_seq < seq``; elsewhere (the embedded SQLite) a lookup then the same guarded UPDATE. The
seq guard makes a repeated or out-of-order heartbeat a harmless no-op, and the same update moves
the attempt's ``heartbeat_deadline``, which the watchdog compares against the clock.

Job-level transitions (starting → running, recovering, failed) belong to the job state machine;
these functions only record what the agent reported.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.db import connection

from jobs import checkpoints, losses
from jobs.models import (
    HEARTBEAT_TIMEOUT_INTERVALS,
    Attempt,
    AttemptState,
    Job,
    LossPoint,
    loss_sample_every,
)
from jobs.tokens import token_digest, token_matches, token_prefix
from nomadgpu.storage import object_store

ACTIVE = [AttemptState.STARTING, AttemptState.RUNNING]
LOG_TAIL_LIMIT = 8 * 1024


# Every agent call authenticates, so the lookup leaves out what most calls never read: the
# team (its sealed secrets cost a decryption each) loads on first use, and so does the job's
# sealed data key (register only).
AUTH_DEFERRED = ("log_tail", "decision", "job__data_key")
# A heartbeat comes every 15 s from every host: it reads only what ``_after_store`` and its
# answer need (``_Layout``), in the statement that stores it.
HEARTBEAT_ATTEMPT_FIELDS = frozenset(
    {"id", "job_id", "number", "state", "end_reason", "token_digest", "pending_command", "step",
     "last_progress_at", "running_at", "resumed_from_step"}
)  # fmt: skip
HEARTBEAT_JOB_FIELDS = frozenset({"id", "heartbeat_interval_s", "stall_timeout_s", "total_steps"})
_JOB_ALIAS = "job__"  # the job's columns in the heartbeat's lookup, apart from the attempt's


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
    return _token_checked(attempt, token)


def _heartbeat_lookup(prefix: str) -> Attempt | None:
    """The attempt holding PREFIX and its job, with only the heartbeat's fields. Written out:
    the ORM spent more CPU building this query than Postgres spent running it."""
    with connection.cursor() as cursor:
        cursor.execute(_layout().select.format(prefix="%s"), [prefix])
        row = cursor.fetchone()
    return None if row is None else _heartbeat_attempt(row)


@dataclass(frozen=True)
class _Layout:
    """The heartbeat's columns (the attempt's, then its job's, each in its model's field order:
    ``Model.from_db`` fills what it is not given in that order), the ORM's converters for those
    that need one (e.g. SQLite's datetimes made aware), and its SQL. Worked out once per
    database vendor: rebuilding it on every beat was a tenth of the request's CPU."""

    attempt_names: list[str]
    job_names: list[str]
    converters: list[tuple[int, list, object]]  # (column, converters, expression)
    select: str  # by ``{prefix}``
    update: str  # the beat into the attempt by id (``record_heartbeat``)
    statement: str  # PostgreSQL only: see _HEARTBEAT_STATEMENT


@functools.cache
def _layout_for(vendor: str) -> _Layout:
    # The converters come from whichever connection asks first; they read only settings (the
    # time zone), so every connection of the vendor can share them.
    attempt_fields = _fields(Attempt, HEARTBEAT_ATTEMPT_FIELDS)
    job_fields = _fields(Job, HEARTBEAT_JOB_FIELDS)
    converters = []
    for i, field in enumerate(attempt_fields + job_fields):
        col = field.get_col(field.model._meta.db_table)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            converters.append((i, found, col))
    quote = connection.ops.quote_name
    columns = [f"a.{quote(f.column)}" for f in attempt_fields]
    columns += [f"j.{quote(f.column)} AS {quote(_JOB_ALIAS + f.column)}" for f in job_fields]
    # Only names from the models go into the text; the prefix is a parameter.
    select = (
        f"SELECT {', '.join(columns)} FROM {quote(Attempt._meta.db_table)} a "  # noqa: S608
        f"JOIN {quote(Job._meta.db_table)} j ON j.id = a.job_id "
        "WHERE a.token_prefix = {prefix}"
    )
    deadline = (
        "CASE WHEN %(gpu_ok)s THEN %(now)s + make_interval(secs => "
        f"prev.{_JOB_ALIAS}heartbeat_interval_s * %(timeout_intervals)s) ELSE %(now)s END"
    )
    statement = _HEARTBEAT_STATEMENT.format(
        select=select.format(prefix="%(prefix)s"),
        table=quote(Attempt._meta.db_table),
        set=_HEARTBEAT_SET.format(deadline=deadline, delivered="prev.pending_command"),
        writable=_WRITABLE,
    )
    set_ = _HEARTBEAT_SET.format(deadline="%(deadline)s", delivered="%(delivered)s")
    table = quote(Attempt._meta.db_table)
    update = f"UPDATE {table} AS a SET {set_} WHERE a.id = %(id)s AND {_WRITABLE}"  # noqa: S608
    return _Layout(
        attempt_names=[f.attname for f in attempt_fields],
        job_names=[f.attname for f in job_fields],
        converters=converters,
        select=select,
        update=update,
        statement=statement,
    )


def _layout() -> _Layout:
    return _layout_for(connection.vendor)


def _heartbeat_attempt(row) -> Attempt:
    """The attempt (and its job) of one row of the heartbeat's columns."""
    layout = _layout()
    values = list(row)
    for i, converters, col in layout.converters:
        for convert in converters:
            values[i] = convert(values[i], col, connection)
    split = len(layout.attempt_names)
    attempt = Attempt.from_db(connection.alias, layout.attempt_names, values[:split])
    attempt.job = Job.from_db(connection.alias, layout.job_names, values[split:])
    return attempt


def _fields(model, names: frozenset[str]) -> list:
    return [f for f in model._meta.concrete_fields if f.attname in names]


def heartbeat_deadline(attempt: Attempt, now: datetime) -> datetime:
    return now + attempt.job.heartbeat_timeout


def _token_checked(attempt: Attempt | None, token: str) -> Attempt:
    """ATTEMPT if TOKEN is its token and it is live; raises TokenUnknown, AttemptNotRentedYet or
    TokenDead otherwise (what the agent API answers 401, 503 and 410)."""
    if attempt is None or not token_matches(token, attempt.token_digest):
        raise TokenUnknown
    if attempt.state == AttemptState.REQUESTED:
        raise AttemptNotRentedYet
    if attempt.state not in ACTIVE:
        raise TokenDead(attempt.end_reason or attempt.state)
    return attempt


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
    net_rx_bytes: int | None = None  # None: not reported (an older agent); the stored value stays
    net_tx_bytes: int | None = None


def heartbeat(token: str, beat: Heartbeat, *, now: datetime) -> dict:
    """Authenticate TOKEN, store BEAT in its attempt and answer with the command for the agent.

    Raises what ``authenticate_agent`` raises, and then nothing was written. On PostgreSQL the
    lookup and the write are one statement (``_HEARTBEAT_STATEMENT``): one round trip, and the
    write is guarded by the token's digest, so a wrong token changes nothing."""
    if connection.vendor != "postgresql":
        return record_heartbeat(authenticate_agent(token, for_heartbeat=True), beat, now=now)
    attempt, stored = _look_up_and_store(token, beat, now=now)
    return _after_store(_token_checked(attempt, token), beat, stored=stored, now=now)


def record_heartbeat(attempt: Attempt, beat: Heartbeat, *, now: datetime) -> dict:
    """Store BEAT for ATTEMPT (authenticated, loaded with the heartbeat's fields) and answer
    with the command for the agent."""
    params = _heartbeat_params(beat, now=now)
    params.update(
        id=attempt.pk,
        deadline=now if not beat.gpu_ok else heartbeat_deadline(attempt, now),
        delivered=attempt.pending_command,
    )
    with connection.cursor() as cursor:
        cursor.execute(_layout().update, params)
        stored = cursor.rowcount > 0
    return _after_store(attempt, beat, stored=stored, now=now)


def _after_store(attempt: Attempt, beat: Heartbeat, *, stored: bool, now: datetime) -> dict:
    """The rest of a heartbeat, decided on ATTEMPT as it was before BEAT: a stall pulls the
    deadline to now (the watchdog's next tick finds it), training reported running moves the
    job to running, and the loss may be sampled. A stale or repeated beat (not STORED) only
    gets its answer."""
    if stored:
        if _stalled(attempt, beat, now):
            Attempt.objects.filter(pk=attempt.pk, state__in=ACTIVE).update(heartbeat_deadline=now)
        if attempt.state == AttemptState.STARTING and beat.phase == "running":
            losses.mark_running(attempt, now=now)
        sample_loss(attempt, beat, now=now)
    # checkpoint_now is delivered once (the store cleared it); stop stays until the agent is gone.
    command = attempt.pending_command or "continue"
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


# The heartbeat's guarded write, written out: building it with the ORM (a CASE, five COALESCEs)
# cost more CPU than the rest of the request. A missing step, total, loss or traffic total keeps
# the stored value; progress is a step above the stored one; a pending checkpoint_now is cleared
# only if it is the command this beat's answer delivers ({delivered}).
_HEARTBEAT_SET = """
    last_seq = %(seq)s, last_heartbeat_at = %(now)s, heartbeat_deadline = {deadline},
    phase = %(phase)s,
    last_progress_at = CASE WHEN %(has_step)s AND (a.step IS NULL OR a.step < %(step)s)
                       THEN %(now)s ELSE a.last_progress_at END,
    step = COALESCE(%(step)s, a.step), total_steps = COALESCE(%(total_steps)s, a.total_steps),
    loss = COALESCE(%(loss)s, a.loss), seconds_per_step = %(seconds_per_step)s,
    gpu_ok = %(gpu_ok)s, gpu_error = %(gpu_error)s, bytes_down = %(bytes_down)s,
    bytes_up = %(bytes_up)s, log_tail = %(log_tail)s,
    net_rx_bytes = COALESCE(%(net_rx_bytes)s, a.net_rx_bytes),
    net_tx_bytes = COALESCE(%(net_tx_bytes)s, a.net_tx_bytes),
    pending_command = CASE WHEN a.pending_command = 'checkpoint_now'
                           AND {delivered} = 'checkpoint_now'
                      THEN '' ELSE a.pending_command END
"""
_WRITABLE = "a.state IN (%(starting)s, %(running)s) AND a.last_seq < %(seq)s"

# PostgreSQL: the lookup (``prev``, the row before the beat) and the write in one statement.
# The deadline is the job's ``heartbeat_timeout`` after now (now on a GPU fault), computed here
# because the job's interval is only known inside the statement.
_HEARTBEAT_STATEMENT = """
WITH prev AS ({select}),
stored AS (
    UPDATE {table} AS a SET {set}
    FROM prev
    WHERE a.id = prev.id AND prev.token_digest = %(digest)s AND {writable}
    RETURNING a.id
)
SELECT prev.*, EXISTS (SELECT FROM stored) FROM prev
"""


def _heartbeat_params(beat: Heartbeat, *, now: datetime) -> dict:
    adapt = connection.ops.adapt_datetimefield_value
    return {
        "seq": beat.seq,
        "now": adapt(now),
        "phase": beat.phase,
        "has_step": beat.step is not None,
        "step": beat.step,
        "total_steps": beat.total_steps,
        "loss": beat.loss,
        "seconds_per_step": beat.seconds_per_step,
        "gpu_ok": beat.gpu_ok,
        "gpu_error": beat.gpu_error[:300],
        "bytes_down": beat.bytes_down,
        "bytes_up": beat.bytes_up,
        "net_rx_bytes": beat.net_rx_bytes,
        "net_tx_bytes": beat.net_tx_bytes,
        "log_tail": beat.log_tail[-LOG_TAIL_LIMIT:],
        "starting": AttemptState.STARTING,
        "running": AttemptState.RUNNING,
    }


def _look_up_and_store(
    token: str, beat: Heartbeat, *, now: datetime
) -> tuple[Attempt | None, bool]:
    """The attempt holding TOKEN's prefix as it was before BEAT, and whether BEAT was stored:
    only if the token's digest matches, the attempt is live and BEAT is its newest."""
    params = _heartbeat_params(beat, now=now)
    params.update(
        prefix=token_prefix(token),
        digest=token_digest(token),
        timeout_intervals=HEARTBEAT_TIMEOUT_INTERVALS,
    )
    row = _fetch_prepared(_layout().statement, params)
    if row is None:
        return None, False
    return _heartbeat_attempt(row[:-1]), row[-1]


def _fetch_prepared(sql: str, params: dict) -> tuple | None:
    """The first row of SQL run as a prepared statement on the server (planned once per
    connection). Django binds parameters on the client and plans every statement again (it
    leaves prepared statements off for the sake of connection poolers; a pooler in transaction
    mode needs PgBouncer 1.21 or newer here). Planning the heartbeat's join cost PostgreSQL more
    CPU than running it."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=True)
        return cursor.fetchone()


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
