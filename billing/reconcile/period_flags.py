"""Small differences that add up: a UTC day or month whose matched attempts, each within the
tolerance, sum to a difference outside it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from billing.models import DiscrepancyFlag, FlagPeriod, FlagStatus
from billing.reconcile.attempt import AttemptReconciliation, charges_prefetch, reconcile_attempt
from billing.reconcile.review import close_open_flags
from billing.reconcile.tolerance import Status, Summed, Tolerance, difference_status
from jobs.models import Attempt
from nomadgpu.humanize import money

PERIODS = (FlagPeriod.DAY, FlagPeriod.MONTH)


def period_start(period: str, moment: datetime) -> date:
    """The first UTC day of the PERIOD ("day" or "month") that MOMENT falls in."""
    day = moment.astimezone(UTC).date()
    return day.replace(day=1) if period == FlagPeriod.MONTH else day


def period_end(period: str, start: date) -> date:
    """The first UTC day after the PERIOD that begins on START."""
    if period == FlagPeriod.DAY:
        return start + timedelta(days=1)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


@dataclass(frozen=True)
class PeriodTotal(Summed):
    """A team's attempts rented in one UTC day or month that each matched within the
    per-attempt tolerance, summed: a systematic difference too small to flag any one of them
    adds up here. Attempts flagged on their own are left out (they are flagged already)."""

    parts = "attempts"

    period: str
    start: date
    attempts: tuple[AttemptReconciliation, ...]


def periods_of(rows) -> set[tuple[str, date]]:
    """(period, first day) of every UTC day and month the ROWS' attempts were rented in."""
    return {(p, period_start(p, r.attempt.rented_at)) for r in rows for p in PERIODS}


def period_totals(rows, periods) -> list[PeriodTotal]:
    """The matched ROWS of each of PERIODS ((period, first day) pairs), summed per period."""
    matched = [r for r in rows if r.status == Status.MATCHED]
    return [
        PeriodTotal(
            p, start, tuple(r for r in matched if period_start(p, r.attempt.rented_at) == start)
        )
        for p, start in sorted(periods)
    ]


def period_reopens(flag: DiscrepancyFlag, total: PeriodTotal, tolerance: Tolerance) -> bool:
    """Whether a reviewed period flag opens again: the period's difference moved on from the
    one reviewed by more than the tolerance allows on the period's recorded amount (a month
    reviewed on its 3rd that kept being overcharged), not by the next few attempts' cents."""
    moved = abs(total.diff - float(flag.billed_usd - flag.recorded_usd))
    return not tolerance.allows(total.recorded, total.recorded + moved)


@dataclass(frozen=True)
class PeriodScope:
    """Where ``flag_periods`` looks: TEAM's attempts, as of NOW, the look-back starting SINCE."""

    team: object
    now: datetime
    since: datetime
    tolerance: Tolerance
    covered: datetime | None


def flag_periods(scope: PeriodScope, rows) -> int:
    """Keep one ``DiscrepancyFlag`` per team and UTC day or month whose matched attempts add
    up to a difference outside the tolerance (the same rule, on the period's totals), with its
    total and the count of attempts; close one whose period adds up again. ROWS are the
    attempts just reconciled (ended in the look-back); the rest of their periods' attempts,
    ended before it, are reconciled here. Returns how many flags were created. The key is
    (team, period, first day): a re-run updates that flag, never adds a second one."""
    periods = periods_of(rows)
    rows = [*rows, *_earlier_rows(scope, periods)]
    return sum(_flag_period(scope, total) for total in period_totals(rows, periods))


def _earlier_rows(scope: PeriodScope, periods) -> list[AttemptReconciliation]:
    """The attempts rented in PERIODS that ended before the look-back, reconciled."""
    if not periods:
        return []
    lo = min(start for _, start in periods)
    hi = max(period_end(p, start) for p, start in periods)
    attempts = Attempt.objects.filter(
        job__team=scope.team,
        rented_at__gte=datetime.combine(lo, time.min, tzinfo=UTC),
        rented_at__lt=datetime.combine(hi, time.min, tzinfo=UTC),
        ended_at__lt=scope.since,
    ).prefetch_related(charges_prefetch())
    return [
        reconcile_attempt(a, now=scope.now, tolerance=scope.tolerance, covered=scope.covered)
        for a in attempts
    ]


def _flag_period(scope: PeriodScope, total: PeriodTotal) -> int:
    key = {"team": scope.team, "period": total.period, "period_start": total.start}
    flag = DiscrepancyFlag.objects.filter(**key).first()
    status = difference_status(total.recorded, total.billed, scope.tolerance)
    if status == Status.MATCHED:
        if flag is not None:
            note = "the period's attempts add up within the tolerance after a later import"
            close_open_flags(DiscrepancyFlag.objects.filter(pk=flag.pk), note=note, now=scope.now)
        return 0
    numbers = period_numbers(total, status, now=scope.now)
    if flag is None:
        _, new = DiscrepancyFlag.objects.get_or_create(
            **key, defaults={**numbers, "created_at": scope.now}
        )
        return int(new)
    if flag.status == FlagStatus.OPEN:
        DiscrepancyFlag.objects.filter(pk=flag.pk).update(**numbers)
    elif period_reopens(flag, total, scope.tolerance):
        DiscrepancyFlag.objects.filter(pk=flag.pk).update(status=FlagStatus.OPEN, **numbers)
    return 0


def period_numbers(total: PeriodTotal, status: str, *, now: datetime) -> dict:
    """A period flag's stored figures and its reason: the total and the count of attempts."""
    n = len(total.attempts)
    when = f"{total.start:%Y-%m}" if total.period == FlagPeriod.MONTH else f"{total.start}"
    share = f" ({total.pct:+.1f} %)" if total.pct is not None else ""
    reason = (
        f"{n} attempt{'s' if n != 1 else ''} each within the per-attempt tolerance, "
        f"{Status.LABELS[status]} by {money(abs(total.diff))} in total{share} "
        f"in the UTC {total.period} {when}"
    )
    return {
        "kind": status,
        "recorded_usd": Decimal(f"{total.recorded:.4f}"),
        "billed_usd": Decimal(f"{total.billed:.4f}"),
        "attempts_count": n,
        "reason": reason[:300],
        "updated_at": now,
    }
