"""Reconciliation: what Vast billed against what NomadGPU recorded, and the savings.

"Recorded" is ``billing.spend.attempt_spend`` as measured (rates copied at rent, the attempt's
own timestamps, the container's byte counters and the image pull estimate; never the billed
traffic that spend counts for budgets). "Billed" is the sum of the imported charges matched to
the attempt. They are compared per component — GPU, storage, download, upload, the charge
items ``gpu``, ``disk``, ``bwd``, ``bwu`` — and in total.

Statuses (``Status``): matched (every component and the total within the tolerance: 2 % of
the recorded amount or $0.01, whichever is larger), over-billed, under-billed, unmatched
charge (no attempt: an orphan or a rental made outside NomadGPU), unbilled usage (recorded
usage, no charge at all), and pending (the attempt is live, or ended after the last import:
its invoice is not complete yet, so it is neither compared nor flagged).

Periods: an attempt belongs to the UTC day it was rented on, with all its charges; a charge
without an attempt belongs to its own day.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import ClassVar

from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch, Sum

from billing.cost import JobCost, cost_of, covered_until
from billing.cost import job_cost as job_cost  # re-exported: the one cost lives in billing.cost
from billing.models import (
    Charge,
    ChargeItem,
    DiscrepancyFlag,
    FlagPeriod,
    FlagStatus,
)
from billing.spend import GB, attempt_spend, traffic_bytes
from jobs.models import Attempt, JobEvent
from nomadgpu.humanize import money

logger = logging.getLogger(__name__)

# A charge belongs to an attempt whose rental it overlaps; this much slack absorbs clock
# skew between Vast's usage records and ours.
MATCH_SLACK = timedelta(hours=1)
COMPONENTS = (  # (name in Spend, charge item type, unit of the quantities)
    ("gpu", "gpu", "h"),
    ("storage", "disk", "GB-h"),  # or "h" when Vast bills it in hours (``storage_unit``)
    ("download", "bwd", "GB"),
    ("upload", "bwu", "GB"),
)
HOUR_UNITS = frozenset({"h", "hr", "hrs", "hour", "hours"})


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


@dataclass(frozen=True)
class Component(Difference):
    """One billing component of one attempt (or a sum of them)."""

    name: str
    recorded: float
    billed: float
    recorded_qty: float
    billed_qty: float | None
    unit: str
    billed_rate: float | None = None
    recorded_rate: float | None = None
    status: str = Status.MATCHED


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


# --- matching -------------------------------------------------------------------------------


def charge_days(charge: Charge) -> tuple[datetime, datetime]:
    """The UTC days CHARGE covers, from the midnight of its first to the midnight after its last.

    Vast keys charge rows by day at 00:00 UTC: ``start`` and ``end`` are day keys (both the same
    midnight for one day's row), not the first and last second of use, so the usage may lie
    anywhere in those days."""
    first = (charge.start or datetime.combine(charge.day, time.min, tzinfo=UTC)).astimezone(UTC)
    last = (charge.end or first).astimezone(UTC)
    return (
        datetime.combine(first.date(), time.min, tzinfo=UTC),
        datetime.combine(last.date() + timedelta(days=1), time.min, tzinfo=UTC),
    )


def overlaps(charge: Charge, attempt, *, now: datetime) -> bool:
    """Whether ATTEMPT's rental (with ``MATCH_SLACK``) touches a day CHARGE covers: a charge
    belongs to the attempt holding its contract id on that day."""
    if attempt.rented_at is None:
        return False
    begin = attempt.rented_at - MATCH_SLACK
    end = (attempt.ended_at or now) + MATCH_SLACK
    lo, hi = charge_days(charge)
    return lo < end and hi > begin


def match_charges(team, *, now: datetime) -> int:
    """Link TEAM's unmatched charges to attempts by instance id (``source`` "instance-<id>")
    and time; returns how many were linked. Charges that stay unmatched are orphans or
    rentals made outside NomadGPU."""
    pending = Charge.objects.filter(team=team, attempt__isnull=True, instance_id__isnull=False)
    attempts = {
        a.instance_id: a
        for a in Attempt.objects.filter(
            job__team=team, instance_id__in=pending.values("instance_id")
        )
    }
    linked = 0
    for charge in pending:
        attempt = attempts.get(charge.instance_id)
        try:
            if attempt is not None and overlaps(charge, attempt, now=now):
                linked += Charge.objects.filter(pk=charge.pk, attempt__isnull=True).update(
                    attempt=attempt
                )
        except (TypeError, ValueError):  # one odd row stays unmatched; the others go on
            logger.exception("matching charge %s to attempt %s failed", charge.pk, attempt)
    return linked


def note_billed_traffic(team, *, now: datetime) -> int:
    """Copy the traffic billed to each of TEAM's matched attempts onto it, with the moment the
    import covers, so spend (and the budgets) count the invoice without reading charges.
    Returns how many attempts changed."""
    covered = covered_until(team) or now
    billed: dict[int, dict[str, float]] = {
        a: {"billed_download_usd": 0.0, "billed_upload_usd": 0.0}
        for a in Charge.objects.filter(team=team, attempt__isnull=False).values_list(
            "attempt_id", flat=True
        )
    }
    sums = (
        ChargeItem.objects.filter(charge__team=team, charge__attempt__isnull=False)
        .filter(type__in=("bwd", "bwu"))
        .values_list("charge__attempt_id", "type")
        .annotate(total=Sum("amount"))
    )
    for attempt_id, kind, total in sums:
        field = "billed_download_usd" if kind == "bwd" else "billed_upload_usd"
        billed[attempt_id][field] = float(total)
    changed = 0
    for attempt_id, amounts in billed.items():
        changed += (
            Attempt.objects.filter(pk=attempt_id)
            .exclude(billed_through=covered, **amounts)
            .update(billed_through=covered, **amounts)
        )
    return changed


# --- one attempt ----------------------------------------------------------------------------


def recorded_quantities(
    attempt, *, now: datetime, storage_unit: str = "GB-h"
) -> dict[str, tuple[float, float]]:
    """Per component: (quantity in its unit, rate per unit) as NomadGPU recorded them; storage
    in STORAGE_UNIT, the one its charge items use (``storage_unit``)."""
    end = min(attempt.ended_at, now) if attempt.ended_at else now

    def hours(start):
        return max((end - start).total_seconds() / 3600.0, 0.0) if start else 0.0

    down, up = traffic_bytes(attempt)
    return {
        "gpu": (hours(attempt.registered_at), attempt.dph_base),
        "storage": recorded_storage(attempt, hours(attempt.rented_at), storage_unit),
        "download": (down / GB, attempt.download_usd_per_gb),
        "upload": (up / GB, attempt.upload_usd_per_gb),
    }


def recorded_storage(attempt, rented_h: float, unit: str) -> tuple[float, float]:
    """ATTEMPT's recorded storage as (quantity, rate) in UNIT: the hours its disk existed at the
    whole disk's $/hour for "h", else GB-hours at $/GB-hour."""
    if unit == "h":
        return rented_h, attempt.disk_gb * attempt.storage_usd_per_gb_hour
    return attempt.disk_gb * rented_h, attempt.storage_usd_per_gb_hour


def storage_unit(items) -> str:
    """The unit Vast billed storage in on ITEMS (the ``disk`` charge items): "h" when every item
    that says a quantity says hours (Vast's billing page: "0.9765233 hours at $0.018/hour", the
    whole disk at a per-hour rate), else "GB-h" (the old per-GB-month wording, read as
    GB-hours). Recorded storage is then expressed in the same unit: like is compared with like."""
    units = {(i.unit or "").lower() for i in items if i.quantity is not None}
    return "h" if units and units <= HOUR_UNITS else "GB-h"


def counts_in(item, unit: str) -> bool:
    """Whether a storage ITEM's quantity may be summed in UNIT: one in hours only in "h", one in
    GB-hours only in "GB-h" (a mix of the two wordings is not summed: no billed quantity)."""
    return ((item.unit or "").lower() in HOUR_UNITS) == (unit == "h")


def billed_quantity(items, *, storage_unit: str | None = None) -> float | None:
    """The quantity ITEMS billed, summed; None when an item's text did not say it (or, for
    storage items, said it in another unit than STORAGE_UNIT). No item at all billed 0."""
    qty = [
        i.quantity
        for i in items
        if i.quantity is not None and (storage_unit is None or counts_in(i, storage_unit))
    ]
    return float(sum(qty)) if len(qty) == len(items) else None


def billed_items(charges) -> dict[str, list[ChargeItem]]:
    out: dict[str, list[ChargeItem]] = {}
    for charge in charges:
        for item in charge.items.all():
            out.setdefault(item.type, []).append(item)
    return out


def compare_components(
    attempt, charges, *, now: datetime, tolerance: Tolerance
) -> tuple[Component, ...]:
    """Recorded vs billed for GPU, storage, download and upload of ATTEMPT."""
    spend = attempt_spend(attempt, now=now, invoiced=False)
    items = billed_items(charges)
    storage = storage_unit(items.get("disk", []))
    quantities = recorded_quantities(attempt, now=now, storage_unit=storage)
    out = []
    for name, item_type, default_unit in COMPONENTS:
        unit = storage if name == "storage" else default_unit
        mine = items.get(item_type, [])
        billed = float(sum((i.amount for i in mine), Decimal(0)))
        rates = [i.rate for i in mine if i.rate is not None]
        recorded = getattr(spend, name)
        out.append(
            Component(
                name=name,
                recorded=recorded,
                billed=billed,
                recorded_qty=quantities[name][0],
                billed_qty=billed_quantity(
                    mine, storage_unit=storage if name == "storage" else None
                ),
                unit=unit,
                billed_rate=float(rates[0]) if rates else None,
                recorded_rate=quantities[name][1],
                status=difference_status(recorded, billed, tolerance),
            )
        )
    return tuple(out)


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


# --- jobs and periods -----------------------------------------------------------------------


def charges_prefetch() -> Prefetch:
    return Prefetch("charges", queryset=Charge.objects.prefetch_related("items"))


@dataclass(frozen=True)
class Savings:
    """Billed (or estimated) cost against renting the team's reference for the same work."""

    cost: float
    reference_usd: float
    reference_hours: float

    @property
    def saved_usd(self) -> float:
        return self.reference_usd - self.cost

    @property
    def saved_pct(self) -> float | None:
        return percent(self.saved_usd, self.reference_usd)


def reference_hours(*, machine_h: float, training_h: float, speed_factor: float) -> float:
    """Hours the reference would need: start-up as long as here (downloads do not get faster
    on a faster GPU), training divided by the reference's speed factor."""
    training_h = min(training_h, machine_h)
    return (machine_h - training_h) + training_h / (speed_factor or 1.0)


def savings(team, *, cost: float, machine_h: float, training_h: float) -> Savings:
    """COST against TEAM's reference rate for MACHINE_H on a machine, TRAINING_H of it training."""
    hours = reference_hours(
        machine_h=machine_h,
        training_h=training_h,
        speed_factor=float(team.reference_speed_factor),
    )
    return Savings(cost, hours * float(team.reference_rate_usd_per_hour), hours)


def machine_and_training_hours(attempts, *, now: datetime) -> tuple[float, float]:
    """Hours on machines (rented to end) and of training (running to end), summed."""
    machine = training = 0.0
    for a in attempts:
        end = a.ended_at or now
        if a.rented_at:
            machine += max((end - a.rented_at).total_seconds(), 0.0) / 3600.0
        if a.running_at:
            training += max((end - a.running_at).total_seconds(), 0.0) / 3600.0
    return machine, training


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


# --- flags and events -----------------------------------------------------------------------


def flag_discrepancies(team, *, now: datetime, tolerance: Tolerance | None = None) -> int:
    """Keep one ``DiscrepancyFlag`` per flagged attempt, per unmatched charge and per UTC day
    and month whose matched attempts add up outside the tolerance (``flag_periods``), and write
    an ``invoice_discrepancy`` event when an attempt's flag is first created (never again).
    Returns how many flags were created. Unmatched charges and periods have no job, so no job
    event: finance sees them in the period summary."""
    tolerance = tolerance or Tolerance.from_settings()
    covered = covered_until(team)
    since = now - timedelta(days=settings.INVOICE_LOOKBACK_DAYS)
    attempts = (
        Attempt.objects.filter(job__team=team, rented_at__isnull=False, ended_at__gte=since)
        .select_related("job")
        .prefetch_related(charges_prefetch())
    )
    created, rows = 0, []
    for attempt in attempts:
        row = reconcile_attempt(attempt, now=now, tolerance=tolerance, covered=covered)
        rows.append(row)
        if row.flagged:
            created += _flag_attempt(team, row, now=now)
        elif row.status == Status.MATCHED:
            close_open_flags(
                DiscrepancyFlag.objects.filter(attempt=attempt),
                note="matches the invoice after a later import",
                now=now,
            )
    close_open_flags(
        DiscrepancyFlag.objects.filter(team=team, charge__attempt__isnull=False),
        note="the charge was matched to an attempt after a later import",
        now=now,
    )
    for charge in Charge.objects.filter(team=team, attempt__isnull=True, day__gte=since.date()):
        _, new = DiscrepancyFlag.objects.get_or_create(
            charge=charge,
            defaults={
                "team": team,
                "kind": Status.UNMATCHED_CHARGE,
                "billed_usd": charge.amount,
                "reason": f"no NomadGPU attempt for {charge.source}",
                "created_at": now,
                "updated_at": now,
            },
        )
        created += new
    scope = PeriodScope(team, now=now, since=since, tolerance=tolerance, covered=covered)
    return created + flag_periods(scope, rows)


def _flag_attempt(team, row: AttemptReconciliation, *, now: datetime) -> int:
    attempt = row.attempt
    numbers = {
        "kind": row.status,
        "recorded_usd": Decimal(f"{row.recorded:.4f}"),
        "billed_usd": Decimal(f"{row.billed:.4f}"),
        "reason": row.reason[:300],
        "updated_at": now,
    }
    with transaction.atomic():
        flag, new = DiscrepancyFlag.objects.get_or_create(
            attempt=attempt, defaults={"team": team, "created_at": now, **numbers}
        )
        if not new:
            DiscrepancyFlag.objects.filter(pk=flag.pk).update(**numbers)
            return 0
        JobEvent.objects.record(
            attempt.job_id,
            now=now,
            kind="invoice_discrepancy",
            message=(
                f"Attempt #{attempt.number}: Vast billed {money(row.billed)}, NomadGPU recorded "
                f"{money(row.recorded)} ({Status.LABELS[row.status]}). {row.reason}"
            ),
            data={
                "attempt": attempt.number,
                "instance_id": attempt.instance_id,
                "status": row.status,
                "billed_usd": round(row.billed, 4),
                "recorded_usd": round(row.recorded, 4),
                "difference_usd": round(row.diff, 4),
                "reason": row.reason,
            },
        )
    return 1


# --- periods: small differences that add up ---------------------------------------------------

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


def close_open_flags(flags, *, note: str, now: datetime) -> int:
    """Close FLAGS that are still open because the numbers now agree (no reviewer)."""
    return flags.filter(status=FlagStatus.OPEN).update(
        status=FlagStatus.REVIEWED, note=note, reviewed_at=now, updated_at=now
    )


def mark_reviewed(flag: DiscrepancyFlag, *, user, note: str, now: datetime) -> bool:
    """Mark FLAG reviewed with NOTE; False if someone else reviewed it first."""
    return bool(
        DiscrepancyFlag.objects.filter(pk=flag.pk, status=FlagStatus.OPEN).update(
            status=FlagStatus.REVIEWED, note=note, reviewed_by=user, reviewed_at=now
        )
    )
