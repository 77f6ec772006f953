"""A job's cost: the one number, label and breakdown every surface shows.

``job_cost`` decides it. The job page (and its budget share) and list, the member API and so
the CLI, the finished notification, the Job admin and the finance pages all show what it
returns, written by ``nomadgpu.humanize.money``.

- **recorded** until the imported invoice covers the job: what NomadGPU recorded
  (``billing.spend``: the rates copied at rent, the attempts' own times, the container's
  byte counters, and the traffic an import has already billed), the figure the spending
  limits count;
- **invoiced** once it does (every rented attempt ended before the last import, and Vast
  billed at least one of them): the sum of the charge items matched to its attempts, GPU
  (``gpu``), storage (``disk``), download (``bwd``) and upload (``bwu``), as reconciliation
  compares them. The invoice is the truth.

Each part is kept to the micro-dollar (the invoice's items have four decimals), and the
total is the sum of the parts as kept, so the API's breakdown adds up to its total exactly.
Shown, the parts are written at the total's precision and the rounding remainder goes to the
largest part (``shown_parts``), so the breakdown on a page adds up to the total on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Max, Prefetch
from django.utils import timezone

from billing.models import Charge, InvoiceSync
from billing.spend import Spend, attempt_spend
from nomadgpu.humanize import money, money_places, money_value

RECORDED, INVOICED = "recorded", "invoiced"
PARTS = ("gpu", "storage", "download", "upload")  # the order every breakdown is written in
PART_OF_ITEM = {"gpu": "gpu", "disk": "storage", "bwd": "download", "bwu": "upload"}
PART_LABELS = {"gpu": "GPU", "storage": "storage", "download": "download", "upload": "upload"}
MICRO = Decimal("0.000001")
_LOOK_UP = object()  # job_cost's ``covered`` default: read it only when it can matter


@dataclass(frozen=True)
class JobCost:
    """A job's cost: its parts (dollars, in ``PARTS`` order) and whether they are the
    invoice's (``INVOICED``) or NomadGPU's record (``RECORDED``)."""

    basis: str
    parts: tuple[tuple[str, Decimal], ...]

    @property
    def total(self) -> Decimal:
        """The sum of the parts, exactly."""
        return sum((value for _, value in self.parts), Decimal(0))

    @property
    def amount(self) -> float:
        """The total as a float, for arithmetic (savings, projections)."""
        return float(self.total)

    @property
    def invoiced(self) -> bool:
        return self.basis == INVOICED

    @property
    def text(self) -> str:
        """The total by the money rule: "$0.0191"."""
        return money(self.total)

    def breakdown(self) -> list[tuple[str, str]]:
        """(label, amount) per part, written at the total's precision: they add up to
        ``text`` (``shown_parts``)."""
        places = money_places(self.total)
        return [
            (PART_LABELS[name], money(value, places=places))
            for name, value in shown_parts(self.parts, self.total)
        ]

    def as_dict(self) -> dict[str, float]:
        """JSON-ready: each part and the total, to the micro-dollar (the parts add up to it)."""
        return {**{name: float(value) for name, value in self.parts}, "total": float(self.total)}


def shown_parts(parts: Iterable[tuple[str, Decimal]], total: Decimal) -> list[tuple[str, Decimal]]:
    """PARTS rounded to TOTAL's places as the money rule shows it, the remainder of the
    rounding added to the largest part, so that the parts shown add up to the total shown.
    (The largest takes it because a unit of the last digit changes it least, relatively.)"""
    places = money_places(total)
    parts = list(parts)
    shown = [(name, money_value(value, places=places)) for name, value in parts]
    rest = money_value(total, places=places) - sum((v for _, v in shown), Decimal(0))
    if rest and shown:
        largest = max(range(len(parts)), key=lambda i: abs(parts[i][1]))
        name, value = shown[largest]
        shown[largest] = (name, value + rest)
    return shown


def covered_until(team) -> datetime | None:
    """Usage before this moment is on TEAM's imported invoice (last sync, or latest charge)."""
    sync = InvoiceSync.objects.filter(team=team).values_list("synced_until", flat=True).first()
    latest = Charge.objects.filter(team=team).aggregate(m=Max("end"))["m"]
    known = [m for m in (sync, latest) if m is not None]
    return max(known) if known else None


def charges_prefetch() -> Prefetch:
    """Prefetch an attempt queryset's charges with their items (what ``job_cost`` reads)."""
    return Prefetch("charges", queryset=Charge.objects.prefetch_related("items"))


def _rented(attempts: Iterable) -> list:
    return [a for a in attempts if a.rented_at is not None]


def _all_ended_and_billed(rented: list) -> bool:
    return (
        bool(rented)
        and all(a.ended_at is not None for a in rented)
        and any(a.charges.all() for a in rented)
    )


def invoice_covers(attempts: Iterable, *, covered: datetime | None) -> bool:
    """Whether a job's cost is the invoice's: it rented, every rented attempt ended before
    COVERED (the last import's reach, ``covered_until``) and Vast billed at least one of
    them. Until then an attempt's charges may still grow (reconciliation's "pending")."""
    rented = _rented(attempts)
    return (
        covered is not None
        and _all_ended_and_billed(rented)
        and all(a.ended_at <= covered for a in rented)
    )


def _micro(value) -> Decimal:
    return Decimal(str(value)).quantize(MICRO)


def recorded_parts(attempts: Iterable, *, now: datetime) -> tuple[tuple[str, Decimal], ...]:
    """What NomadGPU recorded for ATTEMPTS up to NOW, per part, to the micro-dollar."""
    spend = sum((attempt_spend(a, now=now) for a in attempts), Spend())
    return tuple((name, _micro(getattr(spend, name))) for name in PARTS)


def invoiced_parts(attempts: Iterable) -> tuple[tuple[str, Decimal], ...]:
    """What Vast billed ATTEMPTS, per part: the sums of their charges' items by type."""
    sums = dict.fromkeys(PARTS, Decimal(0))
    for attempt in attempts:
        for charge in attempt.charges.all():
            for item in charge.items.all():
                if item.type in PART_OF_ITEM:
                    sums[PART_OF_ITEM[item.type]] += Decimal(item.amount)
    return tuple((name, sums[name].quantize(MICRO)) for name in PARTS)


def cost_of(attempts: Iterable, *, now: datetime, covered: datetime | None) -> JobCost:
    """The cost of a job whose attempts are ATTEMPTS, the invoice reaching COVERED."""
    attempts = list(attempts)
    if invoice_covers(attempts, covered=covered):
        return JobCost(INVOICED, invoiced_parts(attempts))
    return JobCost(RECORDED, recorded_parts(attempts, now=now))


def job_cost(job, *, now: datetime | None = None, covered=_LOOK_UP) -> JobCost:
    """JOB's cost at NOW (default: now; module docstring): recorded, or invoiced once the
    invoice covers it. Reads ``job.attempts.all()`` and their charges, so a prefetch serves a
    list; the invoice's reach (COVERED) is looked up only for a job whose attempts all ended
    billed."""
    now = now or timezone.now()
    attempts = list(job.attempts.all())
    if covered is _LOOK_UP:
        covered = covered_until(job.team_id) if _all_ended_and_billed(_rented(attempts)) else None
    return cost_of(attempts, now=now, covered=covered)
