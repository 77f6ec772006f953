"""One attempt reconciled: its components, its status and the reason for its largest gap.

Statuses (``Status``): matched (every component and the total within the tolerance: 2 % of
the recorded amount or $0.01, whichever is larger), over-billed, under-billed, unmatched
charge (no attempt: an orphan or a rental made outside NomadGPU), unbilled usage (recorded
usage, no charge at all), and pending (the attempt is live, or ended after the last import:
its invoice is not complete yet, so it is neither compared nor flagged).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from billing.cost import charges_prefetch as charges_prefetch  # re-exported: one prefetch
from billing.models import Charge
from billing.reconcile.components import Component, compare_components
from billing.reconcile.matching import charge_days
from billing.reconcile.tolerance import Status, Summed, Tolerance, difference_status
from nomadgpu.humanize import money


@dataclass(frozen=True)
class AttemptReconciliation(Summed):
    parts = "components"

    attempt: object
    components: tuple[Component, ...]
    charges: tuple[Charge, ...]
    status: str
    reason: str

    @property
    def flagged(self) -> bool:
        return self.status in Status.FLAGGED

    @property
    def pending(self) -> int:
        """1 while its invoice is not complete (``Status.PENDING``), else 0."""
        return int(self.status == Status.PENDING)


def attempt_status(
    attempt, components, charges, *, covered: datetime | None, tolerance: Tolerance
) -> str:
    """The reconciliation status of one attempt (see the module docstring)."""
    if attempt.ended_at is None or covered is None or attempt.ended_at > covered:
        return Status.PENDING
    recorded = sum(c.recorded for c in components)
    billed = sum(c.billed for c in components)
    if not charges:
        return Status.MATCHED if tolerance.allows(recorded, 0.0) else Status.UNBILLED_USAGE
    total = difference_status(recorded, billed, tolerance)
    if total != Status.MATCHED:
        return total
    if all(c.status == Status.MATCHED for c in components):
        return Status.MATCHED
    return Status.OVER_BILLED if billed >= recorded else Status.UNDER_BILLED


def explain(attempt, components, charges) -> str:
    """A short reason for the largest difference: traffic, start-up billed while loading,
    storage after stop, a different rate, or more/less time billed than used."""
    if not charges:
        return "no charge for this instance on the imported invoice"
    worst = max(components, key=lambda c: abs(c.diff))
    if abs(worst.diff) < 0.005:
        return ""
    more = worst.diff > 0
    if rate_differs(worst):
        return (
            f"rate differs: {worst.billed_rate:.6g} billed vs "
            f"{worst.recorded_rate:.6g} recorded per {worst.unit}"
        )
    if worst.billed_qty is None:
        # An item whose text said no quantity (a wording not known): compare money only.
        return (
            f"{worst.name}: {money(worst.billed)} billed vs {money(worst.recorded)} recorded "
            "(item text unparsed)"
        )
    billed_qty = f"{worst.billed_qty:.3f}"
    if worst.name in ("download", "upload"):
        return (
            f"traffic: {billed_qty} GB {worst.name} billed vs {worst.recorded_qty:.3f} GB recorded"
        )
    if worst.name == "gpu":
        rented_h = _rented_hours(attempt)
        if more and worst.billed_qty is not None and worst.billed_qty > rented_h * 1.01:
            return (
                f"GPU hours billed beyond the rental: {billed_qty} h billed, "
                f"{rented_h:.3f} h rented"
            )
        if more:
            return (
                f"start-up billed while loading: {billed_qty} GPU h billed vs "
                f"{worst.recorded_qty:.3f} h after the agent registered"
            )
        return f"less GPU time billed than recorded: {billed_qty} h vs {worst.recorded_qty:.3f} h"
    # Day rows: a row on a day after the rental's last one is storage billed after the stop.
    last_day = max((charge_days(c)[0] for c in charges), default=None)
    if more and attempt.ended_at and last_day and last_day.date() > attempt.ended_at.date():
        return f"storage after stop: billed on {last_day:%Y-%m-%d} (UTC)"
    unit = worst.unit
    return f"storage: {billed_qty} {unit} billed vs {worst.recorded_qty:.3f} {unit} recorded"


def rate_differs(component: Component) -> bool:
    """Whether Vast billed another rate than the one copied at rent (by more than 1 %).
    Storage is skipped: the invoice rounds its rate to 3 decimals (per GB-month in the old
    wording, per hour for the whole disk in Vast's), often more than 1 % of a small one."""
    billed, recorded = component.billed_rate, component.recorded_rate
    if component.name == "storage" or not billed or not recorded:
        return False
    return abs(billed - recorded) > 0.01 * recorded


def _rented_hours(attempt) -> float:
    if attempt.rented_at is None or attempt.ended_at is None:
        return float("inf")
    return (attempt.ended_at - attempt.rented_at).total_seconds() / 3600.0


def reconcile_attempt(
    attempt,
    *,
    now: datetime,
    tolerance: Tolerance | None = None,
    covered: datetime | None = None,
) -> AttemptReconciliation:
    """Recorded vs billed for one attempt, its status and the reason for the largest gap."""
    tolerance = tolerance or Tolerance.from_settings()
    charges = tuple(attempt.charges.all())
    components = compare_components(attempt, charges, now=now, tolerance=tolerance)
    status = attempt_status(attempt, components, charges, covered=covered, tolerance=tolerance)
    reason = explain(attempt, components, charges) if status in Status.FLAGGED else ""
    return AttemptReconciliation(attempt, components, charges, status, reason)
