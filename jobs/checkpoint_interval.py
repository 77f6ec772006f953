"""The adaptive checkpoint interval (Young/Daly): plain functions, no database.

A job that opts in (``checkpoint = "auto"`` in its profile) is asked for a checkpoint every
√(2·δ·MTBF) seconds (Young 1974, Daly 2006): δ is what one checkpoint costs, MTBF the host's
mean time between failures. Checkpointing more often pays δ more often; less often redoes more
work per interruption (half an interval on average). The interval minimises the sum.

- λ (failures per hour) is the team's history for the rental type and GPU model
  (``jobs.renting.preemption_rates``, already blended with ``hosts.selection.prior_rate``);
  its host-loss share is blended again with the machine's own record (its interruptions in its
  rented hours), the team's rate weighing ``selection.PRIOR_WEIGHT_H`` hours. MTBF = 1/λ.
- δ is the median of the job's recent uploads (checkpoint announced → ready), or
  ``DEFAULT_DELTA_S`` until one is measured.
- The interval is clamped: at least ``MIN_INTERVAL_S`` and ``MIN_HEARTBEATS`` heartbeats (a
  request travels on a heartbeat's answer), at most ``MAX_INTERVAL_S``.

``jobs.auto_checkpoint`` applies this in the watchdog's tick; ``bench/checkpoint_interval.py``
simulates it. Nothing here imports Django.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from hosts import selection

SCRIPT, AUTO = "script", "auto"
# Until an upload is measured: 1 GB (the field report's adapter checkpoint is smaller; a full
# model larger) at ~150 Mbit/s, a modest host's upload.
DEFAULT_DELTA_S = 60.0
MIN_INTERVAL_S = 60.0
MIN_HEARTBEATS = 2
MAX_INTERVAL_S = 6 * 3600.0
# A request unanswered this long is ignored: max(3 δ, 4 heartbeats), plus one step (the script
# checkpoints at the end of the step it is in).
IGNORED_AFTER_DELTAS = 3
IGNORED_AFTER_HEARTBEATS = 4

ASK, WAIT, IGNORED = "ask", "wait", "ignored"


def young_daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """√(2·δ·MTBF): seconds between checkpoints that minimise checkpoint cost plus redone work,
    for a checkpoint costing DELTA_S on a host failing every MTBF_S on average (both > 0)."""
    if delta_s <= 0 or mtbf_s <= 0:
        raise ValueError("δ and MTBF must be positive")
    return math.sqrt(2.0 * delta_s * mtbf_s)


def failure_rate_per_h(
    *,
    rental_rate_per_h: float,
    rental_source: str,
    host_loss_per_h: float | None = None,
    machine_interruptions: int = 0,
    machine_hours: float = 0.0,
    weight_h: float = selection.PRIOR_WEIGHT_H,
) -> tuple[float, str]:
    """(λ per hour, where it came from) for one attempt.

    RENTAL_RATE_PER_H is the team's rate for the rental type and GPU (or the prior): host losses
    plus, for a bid, outbids. HOST_LOSS_PER_H is its host-loss share (the on-demand rate; None:
    all of it). The machine's own record, MACHINE_INTERRUPTIONS in MACHINE_HOURS (host losses
    only: an outbid is not held against a machine), replaces that share, blended with it as
    WEIGHT_H hours. A machine with no rented hours gives the rental's rate as is."""
    if machine_hours <= 0:
        return rental_rate_per_h, rental_source
    host = rental_rate_per_h if host_loss_per_h is None else min(host_loss_per_h, rental_rate_per_h)
    outbids = rental_rate_per_h - host
    machine = (machine_interruptions + host * weight_h) / (machine_hours + weight_h)
    where = f"machine {machine_interruptions} in {machine_hours:.1f} h, with {rental_source}"
    return outbids + machine, where


def checkpoint_cost_s(uploads_s: Sequence[float]) -> tuple[float, str]:
    """(δ seconds, where it came from): the median of UPLOADS_S (the job's recent uploads,
    announced → ready), or ``DEFAULT_DELTA_S`` while none was measured."""
    measured = [u for u in uploads_s if u > 0]
    if not measured:
        return DEFAULT_DELTA_S, "default until measured"
    return statistics.median(measured), f"median of {len(measured)} uploads"


@dataclass(frozen=True)
class IntervalChoice:
    """The interval in use and the numbers behind it (``why`` is the one-line reason)."""

    interval_s: float
    rate_per_h: float
    mtbf_s: float
    delta_s: float
    why: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (an infinite MTBF, no failure ever seen nor assumed, is null)."""
        data = asdict(self)
        if math.isinf(self.mtbf_s):
            data["mtbf_s"] = None
        return data


def choose_interval(
    *,
    rate_per_h: float,
    rate_source: str,
    delta_s: float,
    delta_source: str,
    heartbeat_s: float,
) -> IntervalChoice:
    """The checkpoint interval for a host failing RATE_PER_H times an hour and a checkpoint
    costing DELTA_S: Young/Daly, clamped to [max(``MIN_INTERVAL_S``, ``MIN_HEARTBEATS`` x
    HEARTBEAT_S), ``MAX_INTERVAL_S``]; ``why`` names λ, MTBF, δ and their sources."""
    mtbf_s = 3600.0 / rate_per_h if rate_per_h > 0 else math.inf
    raw = young_daly_interval_s(delta_s, mtbf_s) if math.isfinite(mtbf_s) else math.inf
    interval = min(max(raw, shortest_interval_s(heartbeat_s)), MAX_INTERVAL_S)
    why = (
        f"Young/Daly √(2·δ·MTBF): λ {rate_per_h:.3f}/h ({rate_source}), "
        f"MTBF {_hours(mtbf_s)}, δ {delta_s:.0f} s ({delta_source})"
    )
    if interval != raw:
        why += f"; clamped from {_hours(raw)}"
    return IntervalChoice(interval, rate_per_h, mtbf_s, delta_s, why)


def shortest_interval_s(heartbeat_s: float) -> float:
    """The lower clamp of ``choose_interval``: ``MIN_INTERVAL_S`` and ``MIN_HEARTBEATS``
    heartbeats of HEARTBEAT_S, whichever is longer."""
    return max(MIN_INTERVAL_S, MIN_HEARTBEATS * heartbeat_s)


def _hours(seconds: float) -> str:
    if math.isinf(seconds):
        return "unbounded"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def ignored_after_s(delta_s: float, heartbeat_s: float, seconds_per_step: float = 0.0) -> float:
    """How long a request may go unanswered before the script counts as ignoring it:
    max(3 δ, 4 heartbeats), plus one step."""
    waited = max(IGNORED_AFTER_DELTAS * delta_s, IGNORED_AFTER_HEARTBEATS * heartbeat_s)
    return waited + max(seconds_per_step, 0.0)


def next_action(
    *,
    now: datetime,
    interval_s: float,
    last_ready_at: datetime,
    asked_at: datetime | None,
    uploading_since_ask: bool,
    announced_since_ask: bool,
    ignored_after: float,
) -> str:
    """What the supervisor does for one attempt at NOW: ``ASK`` for a checkpoint, ``WAIT``, or
    note that the script ``IGNORED`` the request at ASKED_AT.

    LAST_READY_AT is the newest ready checkpoint of the attempt (its start when none). A request
    newer than that is pending: while a checkpoint announced since is uploading, or until
    IGNORED_AFTER seconds pass with none announced, nothing more is asked. A request answered
    only by failed uploads is not pending: the interval decides again."""
    pending = asked_at is not None and asked_at > last_ready_at
    if pending and uploading_since_ask:
        return WAIT
    if pending and not announced_since_ask:
        waited = (now - asked_at).total_seconds()
        return IGNORED if waited >= ignored_after else WAIT
    due = (now - last_ready_at).total_seconds() >= interval_s
    return ASK if due else WAIT
