"""The adaptive checkpoint interval (Young/Daly): plain functions, no database.

A job that opts in (``checkpoint = "auto"`` in its profile) is asked for a checkpoint every
√(2·δ·MTBF) seconds (Young 1974, Daly 2006): δ is what one checkpoint costs, MTBF the host's
mean time between failures. Checkpointing more often pays δ more often; less often redoes more
work per interruption (half an interval on average). The interval minimises the sum.

- λ (failures per hour) is the team's history for the rental type and GPU model
  (``jobs.renting.interruption_rates.preemption_rates``, already blended with
  ``hosts.selection.prior_rate``); its host-loss share is blended again with the machine's own
  record (its interruptions in its rented hours), the team's rate weighing
  ``selection.PRIOR_WEIGHT_H`` hours. MTBF = 1/λ.
- δ is what an upload takes on *this* host (``checkpoint_cost_s``): the median of the
  attempt's own uploads (checkpoint announced → ready); before its first, the checkpoint's size
  (the job's newest checkpoint, else the spec's ``checkpoint_gb``) over the host's advertised
  upload speed plus ``UPLOAD_OVERHEAD_S``; else the job's uploads on its earlier hosts; else
  ``DEFAULT_DELTA_S``. An upload's time is mostly the host's uplink, so the last host's uploads
  say less about a new host than its own advertised speed does, and its own first upload
  corrects an optimistic advertisement.
- A job is finite (``split_remaining``): Young/Daly assumes an endless run, but the last
  interval of a real one ends with the job's own end, which needs no checkpoint. The R seconds
  of training between the newest ready checkpoint and the end are split into n equal
  intervals, n minimising (n - 1)·δ + R²/(2·n·MTBF) (checkpoints paid against half an interval
  redone per failure, to first order as Young's own derivation); n = 1 asks for none (only for
  a rest of at most ``MAX_INTERVAL_S``: the clamp holds). Without a step count and speed from
  the heartbeat, the plain interval is used.
- The interval is clamped: at least ``MIN_INTERVAL_S`` and ``MIN_HEARTBEATS`` heartbeats (a
  request travels on a heartbeat's answer), at most ``MAX_INTERVAL_S``.

``jobs.checkpoints.requests`` applies this in the watchdog's tick; ``bench/checkpoint_interval.py``
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
# What an upload costs besides its bytes: asking for targets, completing and verifying, the
# manifest (a few round trips; the agent's uploads of small checkpoints measure about this).
UPLOAD_OVERHEAD_S = 2.0
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


def checkpoint_cost_s(
    *,
    this_host_s: Sequence[float] = (),
    size_bytes: float | None = None,
    upload_mbps: float | None = None,
    elsewhere_s: Sequence[float] = (),
) -> tuple[float, str]:
    """(δ seconds, where it came from) for a checkpoint on the attempt's host (module
    docstring): the median of THIS_HOST_S (its own uploads, announced → ready); else SIZE_BYTES
    over UPLOAD_MBPS (its advertised upload speed) plus ``UPLOAD_OVERHEAD_S``; else the median
    of ELSEWHERE_S (the job's uploads on earlier hosts); else ``DEFAULT_DELTA_S``."""
    here = [u for u in this_host_s if u > 0]
    if here:
        return statistics.median(here), f"median of {len(here)} uploads on this host"
    if size_bytes and size_bytes > 0 and upload_mbps and upload_mbps > 0:
        seconds = size_bytes * 8 / (upload_mbps * 1e6) + UPLOAD_OVERHEAD_S
        gb = size_bytes / selection.BYTES_PER_GB
        return seconds, f"{gb:.1f} GB at the host's advertised {upload_mbps:.0f} Mbit/s up"
    before = [u for u in elsewhere_s if u > 0]
    if before:
        return statistics.median(before), f"median of {len(before)} uploads on earlier hosts"
    return DEFAULT_DELTA_S, "default until measured"


def split_remaining(remaining_s: float, *, delta_s: float, mtbf_s: float) -> int:
    """How many equal intervals the REMAINING_S seconds of training after the newest ready
    checkpoint are best split into: the n >= 1 minimising (n - 1)·δ + R²/(2·n·MTBF) (the job's
    end saves the last interval for free). Its continuous optimum is R / √(2·δ·MTBF), so
    only the two whole numbers around it are compared."""
    if remaining_s <= 0 or delta_s <= 0 or not math.isfinite(mtbf_s) or mtbf_s <= 0:
        return 1
    best = remaining_s / young_daly_interval_s(delta_s, mtbf_s)

    def cost(n: int) -> float:
        return (n - 1) * delta_s + remaining_s**2 / (2 * n * mtbf_s)

    return min({max(math.floor(best), 1), max(math.ceil(best), 1)}, key=lambda n: (cost(n), n))


@dataclass(frozen=True)
class IntervalChoice:
    """The interval in use and the numbers behind it (``why`` is the one-line reason)."""

    interval_s: float
    rate_per_h: float
    mtbf_s: float
    delta_s: float
    why: str
    remaining_s: float | None = None  # training left after the newest ready checkpoint
    intervals_left: int | None = None  # what ``split_remaining`` made of it (1: none asked)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (an infinite MTBF or interval, no failure ever seen nor assumed or no
        checkpoint before the end, is null)."""
        data = asdict(self)
        for key in ("mtbf_s", "interval_s"):
            if math.isinf(data[key]):
                data[key] = None
        return data


def choose_interval(
    *,
    rate_per_h: float,
    rate_source: str,
    delta_s: float,
    delta_source: str,
    heartbeat_s: float,
    remaining_s: float | None = None,
) -> IntervalChoice:
    """The checkpoint interval for a host failing RATE_PER_H times an hour and a checkpoint
    costing DELTA_S: Young/Daly; with REMAINING_S (training seconds left after the newest
    ready checkpoint) known, that span split evenly (``split_remaining``), and infinite when
    no checkpoint before the job's end pays. Clamped to [max(``MIN_INTERVAL_S``,
    ``MIN_HEARTBEATS`` x HEARTBEAT_S), ``MAX_INTERVAL_S``]; ``why`` names λ, MTBF, δ, their
    sources and the split."""
    mtbf_s = 3600.0 / rate_per_h if rate_per_h > 0 else math.inf
    raw = young_daly_interval_s(delta_s, mtbf_s) if math.isfinite(mtbf_s) else math.inf
    why = (
        f"Young/Daly √(2·δ·MTBF): λ {rate_per_h:.3f}/h ({rate_source}), "
        f"MTBF {_hours(mtbf_s)}, δ {delta_s:.0f} s ({delta_source})"
    )
    pieces = None
    if remaining_s is not None and remaining_s > 0:
        pieces = split_remaining(remaining_s, delta_s=delta_s, mtbf_s=mtbf_s)
        # The upper clamp holds here too: a long job on a sound host still saves every 6 h.
        pieces = max(pieces, math.ceil(remaining_s / MAX_INTERVAL_S))
        left = f"{_hours(remaining_s)} from the last checkpoint to the end"
        if pieces == 1:
            why += f"; {left}: no checkpoint pays before the end"
            return IntervalChoice(math.inf, rate_per_h, mtbf_s, delta_s, why, remaining_s, 1)
        raw = remaining_s / pieces
        why += f"; the {left} split in {pieces}"
    interval = min(max(raw, shortest_interval_s(heartbeat_s)), MAX_INTERVAL_S)
    if interval != raw:
        why += f"; clamped from {_hours(raw)}"
    return IntervalChoice(interval, rate_per_h, mtbf_s, delta_s, why, remaining_s, pieces)


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
