"""A job's cost: the one number, label and breakdown every surface shows.

``job_cost`` decides it. The job page (and its spend chart) and list, the dashboard's month
(``billing.cost_in_time``), the member API and so the CLI, the finished notification, the Job
admin and the finance pages all show what it returns, written by ``nomadgpu.humanize.money``.
Each attempt of the job counts at one of two figures, and the label says which:

- **recorded**: what NomadGPU recorded (``billing.spend``: the rates copied at rent, the
  moments the poll and the agent saw, the container's byte counters and the image pull where
  it happened), the figure the spending limits count; no import changes it;
- **invoiced**: the sum of the charge items matched to the attempt, GPU (``gpu``), storage
  (``disk``), download (``bwd``) and upload (``bwu``), as reconciliation compares them. The
  invoice is the truth.

An attempt counts at its invoice once that is complete (``invoiced_attempts``): it ended
before the last import's reach (``covered_until``) and Vast billed it; once every rented
attempt of the job ended before that reach and at least one was billed, all of them do (one
Vast billed nothing costs its $0). The job is then **invoiced**; with some of its attempts
invoiced and some not yet, **partly invoiced**, and its cost says both parts ("$0.0141:
$0.0098 invoiced + $0.0043 recorded", ``JobCost.split``); with none, **recorded**. The recorded
part is always what was recorded for those attempts, so an import never lowers it.

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

RECORDED, INVOICED, PARTLY_INVOICED = "recorded", "invoiced", "partly invoiced"
PARTS = ("gpu", "storage", "download", "upload")  # the order every breakdown is written in
PART_OF_ITEM = {"gpu": "gpu", "disk": "storage", "bwd": "download", "bwu": "upload"}
PART_LABELS = {"gpu": "GPU", "storage": "storage", "download": "download", "upload": "upload"}
MICRO = Decimal("0.000001")
_LOOK_UP = object()  # job_cost's ``covered`` default: read it only when it can matter


@dataclass(frozen=True)
class JobCost:
    """A job's cost: its parts (dollars, in ``PARTS`` order), which figure they are
    (``RECORDED``, ``INVOICED`` or ``PARTLY_INVOICED``: the module docstring) and, of the
    total, how much is the invoice's (``invoiced_usd``)."""

    basis: str
    parts: tuple[tuple[str, Decimal], ...]
    invoiced_usd: Decimal = Decimal(0)

    @property
    def total(self) -> Decimal:
        """The sum of the parts, exactly."""
        return sum((value for _, value in self.parts), Decimal(0))

    @property
    def recorded_usd(self) -> Decimal:
        """Of the total, what counts as recorded (the attempts not invoiced yet)."""
        return self.total - self.invoiced_usd

    @property
    def amount(self) -> float:
        """The total as a float, for arithmetic (savings, projections)."""
        return float(self.total)

    @property
    def invoiced(self) -> bool:
        """Whether the whole cost is the invoice's."""
        return self.basis == INVOICED

    @property
    def partly_invoiced(self) -> bool:
        return self.basis == PARTLY_INVOICED

    @property
    def text(self) -> str:
        """The total by the money rule: "$0.0191"."""
        return money(self.total)

    @property
    def split(self) -> str:
        """A partly invoiced cost's two parts, written at the total's precision so that they
        add up to ``text``: "$0.0098 invoiced + $0.0043 recorded"; "" for any other."""
        if not self.partly_invoiced:
            return ""
        places = money_places(self.total)
        halves = (("invoiced", self.invoiced_usd), ("recorded", self.recorded_usd))
        shown = shown_parts(halves, self.total)
        return " + ".join(f"{money(value, places=places)} {name}" for name, value in shown)

    @property
    def described(self) -> str:
        """The total with its label, and a partly invoiced one's parts: "$0.0191 (recorded)",
        "$0.0141 (partly invoiced: $0.0098 invoiced + $0.0043 recorded)"."""
        split = f": {self.split}" if self.split else ""
        return f"{self.text} ({self.basis}{split})"

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


def _closed_by(attempt, covered: datetime | None) -> bool:
    return covered is not None and attempt.ended_at is not None and attempt.ended_at <= covered


def _all_ended_and_billed(rented: list) -> bool:
    return (
        bool(rented)
        and all(a.ended_at is not None for a in rented)
        and any(a.charges.all() for a in rented)
    )


def _any_ended_and_billed(rented: list) -> bool:
    return any(a.ended_at is not None and a.charges.all() for a in rented)


def invoice_covers(attempts: Iterable, *, covered: datetime | None) -> bool:
    """Whether a job's cost is the invoice's: it rented, every rented attempt ended before
    COVERED (the last import's reach, ``covered_until``) and Vast billed at least one of
    them. Until then an attempt's charges may still grow (reconciliation's "pending")."""
    rented = _rented(attempts)
    return _all_ended_and_billed(rented) and all(_closed_by(a, covered) for a in rented)


def invoiced_attempts(attempts: Iterable, *, covered: datetime | None) -> list:
    """Which of a job's ATTEMPTS count at what Vast billed them (module docstring): every
    rented one once the invoice covers the job, else those that ended before COVERED and
    were billed (their charges are complete), else none."""
    rented = _rented(attempts)
    if invoice_covers(rented, covered=covered):
        return rented
    return [a for a in rented if _closed_by(a, covered) and a.charges.all()]


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
    """The cost of a job whose attempts are ATTEMPTS, the invoice reaching COVERED: the
    invoiced attempts at their charges, the others as recorded up to NOW."""
    rented = _rented(attempts)
    billed = invoiced_attempts(rented, covered=covered)
    billed_ids = {id(a) for a in billed}
    rest = [a for a in rented if id(a) not in billed_ids]
    invoiced = invoiced_parts(billed)
    recorded = recorded_parts(rest, now=now)
    parts = tuple((name, value + dict(recorded)[name]) for name, value in invoiced)
    basis = (INVOICED if not rest else PARTLY_INVOICED) if billed else RECORDED
    return JobCost(basis, parts, invoiced_usd=sum((v for _, v in invoiced), Decimal(0)))


def job_cost(job, *, now: datetime | None = None, covered=_LOOK_UP) -> JobCost:
    """JOB's cost at NOW (default: now; module docstring). Reads ``job.attempts.all()`` and
    their charges, so a prefetch serves a list; the invoice's reach (COVERED) is looked up
    only for a job with an attempt that ended billed."""
    now = now or timezone.now()
    attempts = list(job.attempts.all())
    if covered is _LOOK_UP:
        covered = covered_until(job.team_id) if _any_ended_and_billed(_rented(attempts)) else None
    return cost_of(attempts, now=now, covered=covered)
