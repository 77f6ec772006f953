"""The heartbeat's two statements, written out in SQL: the agent API's busiest path.

``load_for_heartbeat`` reads the attempt holding a token prefix, with its job, and only the
columns a heartbeat reads; ``store_heartbeat`` writes one beat into it, guarded by the attempt
being live and the beat being its newest (``last_seq < seq``), so a repeated, stale or late beat
changes nothing. On PostgreSQL both run as prepared statements on the server; elsewhere (the
embedded SQLite) through Django's cursor. The choice is made in ``_run``, by ``connection.vendor``.

The ORM spent more CPU building these two queries (a join, a CASE, five COALESCEs) than the
database spent running them; that is why they are text.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.db import connection

from jobs.models import Attempt, AttemptState, Job

LOG_TAIL_LIMIT = 8 * 1024
GPU_ERROR_LIMIT = 300  # Attempt.gpu_error's max_length
_GPUS_FIELD = Attempt._meta.get_field("gpus")

# What a heartbeat reads: its checks and answer (``heartbeat.record_heartbeat``), the stall
# rule, marking the attempt running and the loss sampling. Other fields load on first use, one
# query each.
HEARTBEAT_ATTEMPT_FIELDS = frozenset(
    {"id", "job_id", "number", "state", "end_reason", "token_digest", "pending_command", "step",
     "last_progress_at", "running_at", "resumed_from_step"}
)  # fmt: skip
HEARTBEAT_JOB_FIELDS = frozenset({"id", "heartbeat_interval_s", "stall_timeout_s", "total_steps"})


@dataclass(frozen=True)
class Heartbeat:
    """One beat as the agent reported it (``api.HeartbeatIn``, its GPU health flattened)."""

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
    # Per GPU (api.GpuIn), as stored.
    gpus: list[dict] = dataclasses.field(default_factory=list)
    # The early phases' bytes (api.PhaseProgressIn), by phase; None from an older agent or once
    # the command runs. Not written by ``store_heartbeat`` (``early_progress`` keeps them).
    phase_progress: dict[str, dict] | None = None


def load_for_heartbeat(prefix: str) -> Attempt | None:
    """The attempt holding token PREFIX, and its job, with only the heartbeat's fields; None if
    no attempt holds it. The token itself is checked by the caller."""
    layout = _layout()
    row = _run(layout.select, [prefix], fetch=True)
    if row is None:
        return None
    values = list(row)
    for i, converters, col in layout.converters:
        for convert in converters:
            values[i] = convert(values[i], col, connection)
    split = len(layout.attempt_names)
    attempt = Attempt.from_db(connection.alias, layout.attempt_names, values[:split])
    attempt.job = Job.from_db(connection.alias, layout.job_names, values[split:])
    return attempt


def store_heartbeat(
    attempt: Attempt, beat: Heartbeat, *, now: datetime, deadline: datetime
) -> bool:
    """Write BEAT into ATTEMPT (as loaded by ``load_for_heartbeat``, before this beat) with the
    watchdog's next DEADLINE. False, and nothing written, when the attempt is no longer live or
    BEAT is not newer than the last stored one.

    A missing step, total, loss or traffic total keeps the stored value. A pending
    ``checkpoint_now`` is cleared only if it is the command this beat's answer delivers (the
    one ATTEMPT was loaded with): one set after the load waits for the next beat."""
    adapt = connection.ops.adapt_datetimefield_value
    params = {
        "id": attempt.pk,
        "seq": beat.seq,
        "now": adapt(now),
        "deadline": adapt(deadline),
        "delivered": attempt.pending_command,
        "phase": beat.phase,
        "has_step": beat.step is not None,
        "step": beat.step,
        "total_steps": beat.total_steps,
        "loss": beat.loss,
        "seconds_per_step": beat.seconds_per_step,
        "gpu_ok": beat.gpu_ok,
        "gpu_error": beat.gpu_error[:GPU_ERROR_LIMIT],
        # As the ORM would write it (a jsonb adapter on PostgreSQL, text on SQLite).
        "gpus": _GPUS_FIELD.get_db_prep_save(beat.gpus, connection),
        "bytes_down": beat.bytes_down,
        "bytes_up": beat.bytes_up,
        "net_rx_bytes": beat.net_rx_bytes,
        "net_tx_bytes": beat.net_tx_bytes,
        "log_tail": beat.log_tail[-LOG_TAIL_LIMIT:],
        "starting": AttemptState.STARTING,
        "running": AttemptState.RUNNING,
    }
    return _run(_layout().update, params, fetch=False) > 0


def _run(sql: str, params: dict | list, *, fetch: bool) -> tuple | int | None:
    """SQL's first row (None if none) with FETCH, else how many rows it changed.

    On PostgreSQL the statement is prepared on the server (planned once per connection):
    Django binds parameters on the client and has every statement planned again, and planning
    the heartbeat's join cost PostgreSQL more CPU than running it. Django leaves prepared
    statements off for the sake of connection poolers (settings turn them on for statements
    that ask); a pooler in transaction mode needs PgBouncer 1.21 or newer for this."""
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchone() if fetch else cursor.rowcount
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() if fetch else cursor.rowcount


@dataclass(frozen=True)
class _Layout:
    """The heartbeat's columns (the attempt's, then its job's, each in its model's field order:
    ``Model.from_db`` fills what it is not given in that order), the ORM's converters for those
    that need one (e.g. SQLite's datetimes made aware), and the two statements."""

    attempt_names: list[str]
    job_names: list[str]
    converters: list[tuple[int, list, object]]  # (column, converters, expression)
    select: str  # by the token prefix
    update: str  # one beat into the attempt, by id


def _layout() -> _Layout:
    return _layout_for(connection.vendor)


@functools.cache
def _layout_for(vendor: str) -> _Layout:
    # Worked out once per vendor: building it is a large share of a beat's CPU.
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
    attempts, jobs = quote(Attempt._meta.db_table), quote(Job._meta.db_table)
    columns = [f"a.{quote(f.column)}" for f in attempt_fields]
    columns += [f"j.{quote(f.column)}" for f in job_fields]
    # Only names from the models go into the text; every value is a parameter.
    select = (
        f"SELECT {', '.join(columns)} FROM {attempts} a "  # noqa: S608
        f"JOIN {jobs} j ON j.id = a.job_id WHERE a.token_prefix = %s"
    )
    update = f"UPDATE {attempts} AS a SET {_SET} WHERE {_WRITABLE}"  # noqa: S608
    return _Layout(
        attempt_names=[f.attname for f in attempt_fields],
        job_names=[f.attname for f in job_fields],
        converters=converters,
        select=select,
        update=update,
    )


def _fields(model, names: frozenset[str]) -> list:
    return [f for f in model._meta.concrete_fields if f.attname in names]


# Progress is a step above the stored one; see store_heartbeat for the rest.
_SET = """
    last_seq = %(seq)s, last_heartbeat_at = %(now)s, heartbeat_deadline = %(deadline)s,
    phase = %(phase)s,
    last_progress_at = CASE WHEN %(has_step)s AND (a.step IS NULL OR a.step < %(step)s)
                       THEN %(now)s ELSE a.last_progress_at END,
    step = COALESCE(%(step)s, a.step), total_steps = COALESCE(%(total_steps)s, a.total_steps),
    loss = COALESCE(%(loss)s, a.loss), seconds_per_step = %(seconds_per_step)s,
    gpu_ok = %(gpu_ok)s, gpu_error = %(gpu_error)s, gpus = %(gpus)s, bytes_down = %(bytes_down)s,
    bytes_up = %(bytes_up)s, log_tail = %(log_tail)s,
    net_rx_bytes = COALESCE(%(net_rx_bytes)s, a.net_rx_bytes),
    net_tx_bytes = COALESCE(%(net_tx_bytes)s, a.net_tx_bytes),
    pending_command = CASE WHEN a.pending_command = 'checkpoint_now'
                           AND %(delivered)s = 'checkpoint_now'
                      THEN '' ELSE a.pending_command END
"""
_WRITABLE = "a.id = %(id)s AND a.state IN (%(starting)s, %(running)s) AND a.last_seq < %(seq)s"
