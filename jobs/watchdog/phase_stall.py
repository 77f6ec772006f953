"""When an early phase of the agent stalls (code, stage, restore), from the bytes it reports on
each heartbeat (PROTOCOL.md, heartbeat ``phase_progress``). Plain values in, like
``start_deadline``, whose link, margins and words it shares.

After register (``phase_due``), each early phase of the agent (code, stage, restore; setup
moves bytes too, but no total is known and a compile moves none, so it is never judged) reports
its bytes done and total on every heartbeat. A phase with bytes left is stalled when none moved
for the bytes left in every phase under way at the link measured so far on this host (else the
advertised one), times the same margin, and at least ``PHASE_FLOOR_S`` (and
``PHASE_FLOOR_BEATS`` heartbeats: bytes are only seen once per beat). The user's cap does not
apply after register: a long setup or a big model download that moves is not a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobs.watchdog.start_deadline import BITS_PER_MBIT, Due, Link, bytes_text, seconds_text

# An early phase is never called stalled sooner than this, nor within this many heartbeats: a
# ranged GET that is retried, or a beat that arrived just before the bytes, is not a stall.
PHASE_FLOOR_S = 60.0
PHASE_FLOOR_BEATS = 4
# The early phases an agent reports bytes for (PROTOCOL.md, heartbeat ``phase_progress``).
EARLY_PHASES = ("code", "stage", "setup", "restore")
MEASURE_MIN_BYTES = 4 * 1024**2  # less than this, or in under MEASURE_MIN_S, measures no link
MEASURE_MIN_S = 2.0


@dataclass(frozen=True)
class PhaseBytes:
    """One early phase as its agent reported it: bytes done, bytes total (None: unknown),
    whether it ended, and when its bytes last moved (PROGRESS_AT, on the supervisor's clock)."""

    done: int
    total: int | None
    finished: bool
    progress_at: datetime

    @property
    def left(self) -> int | None:
        """Bytes still to come, None when the total is unknown."""
        return None if self.total is None else max(self.total - self.done, 0)

    @property
    def judged(self) -> bool:
        """Whether this phase can stall: under way, with bytes left of a known total."""
        return not self.finished and bool(self.left)


@dataclass(frozen=True)
class EarlyProgress:
    """The early phases of one attempt as stored between beats (``as_json``/``from_json``), and
    the bytes that measure this host's link: the sum of the phases' bytes at the first report
    (FIRST_AT, FIRST_BYTES) and at the last one that moved (MOVED_AT, MOVED_BYTES)."""

    phases: Mapping[str, PhaseBytes]
    first_at: datetime
    first_bytes: int
    moved_at: datetime
    moved_bytes: int

    @property
    def measured_mbps(self) -> float | None:
        """This host's link as its agent's phases measured it (the bytes over the time up to the
        last progress, so that a stall does not lower it), None for too few bytes or seconds."""
        moved = self.moved_bytes - self.first_bytes
        seconds = (self.moved_at - self.first_at).total_seconds()
        if moved < MEASURE_MIN_BYTES or seconds < MEASURE_MIN_S:
            return None
        return moved * 8 / seconds / BITS_PER_MBIT

    def as_json(self) -> dict[str, Any]:
        return {
            "phases": {
                name: {
                    "done": p.done,
                    "total": p.total,
                    "finished": p.finished,
                    "at": p.progress_at.isoformat(),
                }
                for name, p in self.phases.items()
            },
            "first": {"at": self.first_at.isoformat(), "bytes": self.first_bytes},
            "moved": {"at": self.moved_at.isoformat(), "bytes": self.moved_bytes},
        }

    @classmethod
    def from_json(cls, data: Any) -> EarlyProgress | None:
        """The stored progress, or None for none (or a row written before a key existed)."""
        try:
            phases = {
                name: PhaseBytes(
                    int(p["done"]),
                    None if p["total"] is None else int(p["total"]),
                    bool(p["finished"]),
                    datetime.fromisoformat(p["at"]),
                )
                for name, p in data["phases"].items()
            }
            first, moved = data["first"], data["moved"]
            return cls(
                phases,
                datetime.fromisoformat(first["at"]),
                int(first["bytes"]),
                datetime.fromisoformat(moved["at"]),
                int(moved["bytes"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def next_progress(
    stored: EarlyProgress | None, reported: Mapping[str, Mapping[str, Any]], *, now: datetime
) -> EarlyProgress:
    """STORED updated with one beat's REPORTED phases (name → bytes_done, bytes_total, done).

    A phase whose bytes rose, that is new, or that ended moved at NOW; one whose bytes fell was
    started again (an agent restarted in the same container counts from 0), which is progress
    too, and so is the measure of the link started again."""
    before = dict(stored.phases) if stored else {}
    phases = {}
    for name, r in reported.items():
        done, total, finished = int(r["bytes_done"]), r.get("bytes_total"), bool(r.get("done"))
        old = before.get(name)
        moved = old is None or done != old.done or (finished and not old.finished)
        at = now if moved else old.progress_at
        phases[name] = PhaseBytes(done, None if total is None else int(total), finished, at)
    phases = {**{k: v for k, v in before.items() if k not in phases}, **phases}
    total_now = sum(p.done for p in phases.values())
    if stored is None or total_now < stored.moved_bytes:
        return EarlyProgress(phases, now, total_now, now, total_now)
    if total_now > stored.moved_bytes:
        return EarlyProgress(phases, stored.first_at, stored.first_bytes, now, total_now)
    return EarlyProgress(
        phases, stored.first_at, stored.first_bytes, stored.moved_at, stored.moved_bytes
    )


def phase_allowance_s(progress: EarlyProgress, link: Link, *, interval_s: float) -> float:
    """How long a phase may go without a byte: every byte still to come in the phases under way
    (they share the link) at LINK with its margin, at least the floor."""
    left = sum(p.left or 0 for p in progress.phases.values() if p.judged)
    floor = max(PHASE_FLOOR_S, PHASE_FLOOR_BEATS * interval_s)
    return max(floor, link.seconds(left))


def phase_due(progress: EarlyProgress, link: Link, *, interval_s: float) -> Due | None:
    """The moment the first phase under way stalls if no byte of it moves (and why), or None
    when none can stall (all done, or none with a known total)."""
    judged = {name: p for name, p in progress.phases.items() if p.judged}
    if not judged:
        return None
    allowance = phase_allowance_s(progress, link, interval_s=interval_s)
    name, phase = min(judged.items(), key=lambda item: item[1].progress_at)
    left = sum(p.left or 0 for p in judged.values())
    quiet = seconds_text(allowance)
    why = f"{name}: {bytes_text(left)} left at {link.words}, at most {quiet} without a byte"
    return Due(phase.progress_at + timedelta(seconds=allowance), why)


def stall_detail(progress: EarlyProgress, link: Link, *, now: datetime) -> str:
    """Why an early phase counts as stalled: "stalled in restore: 0 bytes in 61 s, 310 MB left
    at 80 Mbit/s measured"."""
    judged = {name: p for name, p in progress.phases.items() if p.judged}
    if not judged:
        return "stalled before the command started"
    name, phase = min(judged.items(), key=lambda item: item[1].progress_at)
    quiet = seconds_text((now - phase.progress_at).total_seconds())
    left = sum(p.left or 0 for p in judged.values())
    return f"stalled in {name}: 0 bytes in {quiet}, {bytes_text(left)} left at {link.words}"
