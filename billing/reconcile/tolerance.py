"""When billed is close enough to recorded: the statuses, the tolerance, and billed minus
recorded for anything with both totals.

The tolerance is 2 % of the recorded amount or $0.01, whichever is larger
(``INVOICE_TOLERANCE_PCT``, ``INVOICE_TOLERANCE_USD``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from django.conf import settings


class Status:
    MATCHED = "matched"
    OVER_BILLED = "over_billed"
    UNDER_BILLED = "under_billed"
    UNMATCHED_CHARGE = "unmatched_charge"
    UNBILLED_USAGE = "unbilled_usage"
    PENDING = "pending"

    LABELS = {
        MATCHED: "matched",
        OVER_BILLED: "over-billed",
        UNDER_BILLED: "under-billed",
        UNMATCHED_CHARGE: "unmatched charge",
        UNBILLED_USAGE: "unbilled usage",
        PENDING: "pending",
    }
    FLAGGED = frozenset({OVER_BILLED, UNDER_BILLED, UNMATCHED_CHARGE, UNBILLED_USAGE})


@dataclass(frozen=True)
class Tolerance:
    pct: float = 2.0
    usd: float = 0.01

    @classmethod
    def from_settings(cls) -> Tolerance:
        return cls(pct=settings.INVOICE_TOLERANCE_PCT, usd=settings.INVOICE_TOLERANCE_USD)

    def allows(self, recorded: float, billed: float) -> bool:
        """Whether BILLED is close enough to RECORDED: within pct % of it, or within usd."""
        return abs(billed - recorded) <= max(abs(recorded) * self.pct / 100.0, self.usd) + 1e-9


def difference_status(recorded: float, billed: float, tolerance: Tolerance) -> str:
    """Matched, over-billed or under-billed, for one amount or a total."""
    if tolerance.allows(recorded, billed):
        return Status.MATCHED
    return Status.OVER_BILLED if billed > recorded else Status.UNDER_BILLED


def percent(diff: float, recorded: float) -> float | None:
    return diff / recorded * 100.0 if recorded else None


class Difference:
    """Billed minus recorded, in $ and in % of recorded, for anything with both totals."""

    recorded: float
    billed: float

    @property
    def diff(self) -> float:
        return self.billed - self.recorded

    @property
    def pct(self) -> float | None:
        return percent(self.diff, self.recorded)


class Summed(Difference):
    """``recorded`` and ``billed`` as sums over the parts named by ``parts``."""

    parts: ClassVar[str]

    @property
    def recorded(self) -> float:
        return sum(part.recorded for part in getattr(self, self.parts))

    @property
    def billed(self) -> float:
        return sum(part.billed for part in getattr(self, self.parts))
