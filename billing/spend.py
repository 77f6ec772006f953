"""Recorded spend: what NomadGPU believes each attempt has cost, from the offer's rates.

Vast bills (``shared/vast-api.md`` §7): GPU per second while the instance runs, storage per
second from creation until destroy, traffic per GB each way in any state. The attempt row
holds the rates copied from the offer at rent time and the agent's byte counters, so spend is
computed, never accrued in place: recomputing it is always safe and a recovery can never count
an attempt twice (each attempt is its own interval).

Moments used:
- storage: ``rented_at`` (create accepted) until ``ended_at`` (loss, cancel or finish: the
  instance is destroyed right after) or NOW;
- GPU: ``registered_at`` (the container runs the onstart script, so the agent's first call
  marks the start of ``running``) until the same end. The image pull before it is billed
  storage only, like Vast's ``loading``;
- traffic: the agent's counters (bytes down and up), priced per 1024³ bytes.

An attempt that was never rented (no ``rented_at``) has cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime

GB = 1024**3


@dataclass(frozen=True)
class Spend:
    """Dollars per billing component; ``total`` is their sum."""

    gpu: float = 0.0
    storage: float = 0.0
    download: float = 0.0
    upload: float = 0.0

    @property
    def total(self) -> float:
        return self.gpu + self.storage + self.download + self.upload

    def __add__(self, other: Spend) -> Spend:
        return Spend(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, float]:
        """JSON-ready, with the total."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


def _hours(start: datetime | None, end: datetime) -> float:
    if start is None or end <= start:
        return 0.0
    return (end - start).total_seconds() / 3600.0


def attempt_spend(attempt, *, now: datetime) -> Spend:
    """What ATTEMPT has cost up to NOW (or up to its end, if it ended before NOW)."""
    if attempt.rented_at is None:
        return Spend()
    end = min(attempt.ended_at, now) if attempt.ended_at else now
    return Spend(
        gpu=attempt.dph_base * _hours(attempt.registered_at, end),
        storage=attempt.storage_usd_per_gb_hour * attempt.disk_gb * _hours(attempt.rented_at, end),
        download=attempt.download_usd_per_gb * attempt.bytes_down / GB,
        upload=attempt.upload_usd_per_gb * attempt.bytes_up / GB,
    )


def total_spend(attempts: Iterable, *, now: datetime) -> Spend:
    """The sum of ``attempt_spend`` over ATTEMPTS (e.g. a job's, or a team's in a period)."""
    out = Spend()
    for attempt in attempts:
        out = out + attempt_spend(attempt, now=now)
    return out


def job_spend(job, *, now: datetime) -> Spend:
    """Everything JOB has cost so far, across all its attempts (recoveries included once each)."""
    return total_spend(job.attempts.all(), now=now)
