"""Recorded against billed for each billing component of one attempt: GPU, storage, download,
upload, the charge items ``gpu``, ``disk``, ``bwd``, ``bwu``.

"Recorded" is ``billing.spend.attempt_spend``, what NomadGPU recorded (rates copied at rent, the
moments the poll and the agent saw, the container's byte counters, the image pull where it
happened, and a hedged rent's other racers: the same figure the spending limits count and a
job's cost shows until its invoice arrives). "Billed" is the sum of the charge items of the
charges matched to the attempt. Quantities are compared in the unit the invoice uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.models import ChargeItem
from billing.reconcile.tolerance import Difference, Status, Tolerance, difference_status
from billing.spend import GB, attempt_spend, gpu_started_at, racers_not_kept, traffic_bytes

COMPONENTS = (  # (name in Spend, charge item type, unit of the quantities)
    ("gpu", "gpu", "h"),
    ("storage", "disk", "GB-h"),  # or "h" when Vast bills it in hours (``storage_unit``)
    ("download", "bwd", "GB"),
    ("upload", "bwu", "GB"),
)
HOUR_UNITS = frozenset({"h", "hr", "hrs", "hour", "hours"})


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


def recorded_quantities(
    attempt, *, now: datetime, storage_unit: str = "GB-h"
) -> dict[str, tuple[float, float]]:
    """Per component: (quantity in its unit, rate per unit) as NomadGPU recorded them; storage
    in STORAGE_UNIT, the one its charge items use (``storage_unit``)."""
    end = min(attempt.ended_at, now) if attempt.ended_at else now

    def hours(start):
        return max((end - start).total_seconds() / 3600.0, 0.0) if start else 0.0

    down, up = traffic_bytes(attempt, now=end)
    gpu_h, (storage_qty, storage_rate) = (
        hours(gpu_started_at(attempt)),
        recorded_storage(attempt, hours(attempt.rented_at), storage_unit),
    )
    # A hedged rent's other racers are the attempt's usage too (their charges match it).
    for racer in racers_not_kept(attempt):
        racer_end = min(racer.ended_at or end, end)
        gpu_h += _hours_between(racer.running_at, racer_end)
        storage_qty += recorded_storage(
            racer, _hours_between(racer.rented_at, racer_end), storage_unit
        )[0]
    return {
        "gpu": (gpu_h, attempt.dph_base),
        "storage": (storage_qty, storage_rate),
        "download": (down / GB, attempt.download_usd_per_gb),
        "upload": (up / GB, attempt.upload_usd_per_gb),
    }


def _hours_between(start, end) -> float:
    return max((end - start).total_seconds() / 3600.0, 0.0) if start else 0.0


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
    spend = attempt_spend(attempt, now=now)
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
