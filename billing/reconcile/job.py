"""One job reconciled: every rented attempt, the job's one cost and its savings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from billing.cost import JobCost, cost_of, covered_until
from billing.reconcile.attempt import AttemptReconciliation, charges_prefetch, reconcile_attempt
from billing.reconcile.components import COMPONENTS, Component
from billing.reconcile.reference import Savings, machine_and_training_hours, savings
from billing.reconcile.tolerance import Status, Summed, Tolerance


@dataclass(frozen=True)
class JobReconciliation(Summed):
    parts = "attempts"

    job: object
    attempts: tuple[AttemptReconciliation, ...]
    cost: JobCost
    savings: Savings
    flag_ids: tuple[int, ...] = ()

    @property
    def status(self) -> str:
        """The worst attempt status: flagged ones first, then pending, else matched."""
        statuses = [a.status for a in self.attempts]
        for status in (Status.OVER_BILLED, Status.UNDER_BILLED, Status.UNBILLED_USAGE):
            if status in statuses:
                return status
        return Status.PENDING if Status.PENDING in statuses else Status.MATCHED

    @property
    def pending(self) -> int:
        """How many of its attempts are not billed yet (live, or ended after the last
        import): its difference has no percentage while any is (``templatetags.finance``)."""
        return sum(1 for a in self.attempts if a.status == Status.PENDING)

    @property
    def reason(self) -> str:
        flagged = [a for a in self.attempts if a.flagged]
        return max(flagged, key=lambda a: abs(a.diff)).reason if flagged else ""

    def components(self) -> list[Component]:
        """Per component, summed over the attempts."""
        out = []
        for n, (name, _, unit) in enumerate(COMPONENTS):
            parts = [a.components[n] for a in self.attempts]
            units = {p.unit for p in parts}
            # Storage may be in hours for one attempt and GB-hours for another: no sum then.
            billed_qty = [p.billed_qty for p in parts if p.billed_qty is not None]
            same = len(units) <= 1
            out.append(
                Component(
                    name=name,
                    recorded=sum(p.recorded for p in parts),
                    billed=sum(p.billed for p in parts),
                    recorded_qty=sum(p.recorded_qty for p in parts) if same else 0.0,
                    billed_qty=sum(billed_qty) if billed_qty and same else None,
                    unit=units.pop() if len(units) == 1 else unit,
                )
            )
        return out


def reconcile_job(
    job,
    *,
    now: datetime,
    tolerance: Tolerance | None = None,
    covered: datetime | None = None,
    attempts=None,
) -> JobReconciliation:
    """Every rented attempt of JOB reconciled, its cost (``billing.cost``: the same the other
    surfaces show) and its savings."""
    tolerance = tolerance or Tolerance.from_settings()
    if covered is None:
        covered = covered_until(job.team)
    if attempts is None:
        attempts = job.attempts.filter(rented_at__isnull=False).prefetch_related(charges_prefetch())
    rows = tuple(
        reconcile_attempt(a, now=now, tolerance=tolerance, covered=covered) for a in attempts
    )
    cost = cost_of([r.attempt for r in rows], now=now, covered=covered)
    machine_h, training_h = machine_and_training_hours([r.attempt for r in rows], now=now)
    return JobReconciliation(
        job,
        rows,
        cost,
        savings(job.team, cost=cost.amount, machine_h=machine_h, training_h=training_h),
    )
