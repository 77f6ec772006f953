"""What finance sees for a span of UTC days: every job with an attempt rented in it,
reconciled, and the charges of those days that no attempt claims.

Periods: an attempt belongs to the UTC day it was rented on, with all its charges; a charge
without an attempt belongs to its own day.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from billing.cost import covered_until
from billing.models import Charge
from billing.reconcile.attempt import charges_prefetch
from billing.reconcile.components import COMPONENTS, Component
from billing.reconcile.job import JobReconciliation, reconcile_job
from billing.reconcile.reference import Savings
from billing.reconcile.tolerance import Difference, Status, Tolerance
from jobs.models import Attempt


@dataclass
class PeriodReport(Difference):
    team: object
    start: date
    end: date
    jobs: list[JobReconciliation] = field(default_factory=list)
    unmatched: list[Charge] = field(default_factory=list)

    @property
    def recorded(self) -> float:
        return sum(j.recorded for j in self.jobs)

    @property
    def billed(self) -> float:
        return sum(j.billed for j in self.jobs) + self.unmatched_usd

    @property
    def unmatched_usd(self) -> float:
        return float(sum((c.amount for c in self.unmatched), Decimal(0)))

    @property
    def pending(self) -> int:
        """How many of its attempts are not billed yet."""
        return self.count(Status.PENDING)

    def count(self, status: str) -> int:
        return sum(1 for j in self.jobs for a in j.attempts if a.status == status)

    @property
    def savings(self) -> Savings:
        return Savings(
            cost=sum(j.savings.cost for j in self.jobs),
            reference_usd=sum(j.savings.reference_usd for j in self.jobs),
            reference_hours=sum(j.savings.reference_hours for j in self.jobs),
        )

    def components(self) -> list[Component]:
        out = []
        for n, (name, _, unit) in enumerate(COMPONENTS):
            parts = [j.components()[n] for j in self.jobs]
            out.append(
                Component(
                    name=name,
                    recorded=sum(p.recorded for p in parts),
                    billed=sum(p.billed for p in parts),
                    recorded_qty=sum(p.recorded_qty for p in parts),
                    billed_qty=None,
                    unit=unit,
                )
            )
        return out


def period_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    return (
        datetime.combine(start, time.min, tzinfo=UTC),
        datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC),
    )


def reconcile_between(
    team, lo: datetime, hi: datetime, *, now: datetime, tolerance: Tolerance | None = None
) -> list[JobReconciliation]:
    """Every job of TEAM with an attempt rented in [LO, HI), those attempts reconciled (the
    savings report of any window: the finance period, a status page's days), newest first."""
    tolerance = tolerance or Tolerance.from_settings()
    covered = covered_until(team)
    attempts = (
        Attempt.objects.filter(job__team=team, rented_at__gte=lo, rented_at__lt=hi)
        .select_related("job", "job__team")
        .prefetch_related(charges_prefetch())
        .order_by("job_id", "number")
    )
    by_job: dict[int, list] = {}
    for attempt in attempts:
        by_job.setdefault(attempt.job_id, []).append(attempt)
    jobs = [
        reconcile_job(mine[0].job, now=now, tolerance=tolerance, covered=covered, attempts=mine)
        for mine in by_job.values()
    ]
    return sorted(jobs, key=lambda j: j.job.created_at, reverse=True)


def reconcile_period(
    team, start: date, end: date, *, now: datetime, tolerance: Tolerance | None = None
) -> PeriodReport:
    """Every job with an attempt rented in [START, END] (UTC days), and the unmatched charges
    of those days."""
    report = PeriodReport(team, start, end)
    lo, hi = period_bounds(start, end)
    report.jobs = reconcile_between(team, lo, hi, now=now, tolerance=tolerance)
    report.unmatched = list(
        Charge.objects.filter(team=team, attempt__isnull=True, day__gte=start, day__lte=end)
        .prefetch_related("items")
        .order_by("day", "source")
    )
    return report
