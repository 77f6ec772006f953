"""The one store both ways in write to: a contract's charges on one day, upserted on (team,
source, day) with its items, and which of an account's charges are a team's."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from billing.models import Charge, ChargeItem
from hosts import vast
from jobs.models import Attempt, Racer


@dataclass
class ImportResult:
    """What one import did."""

    days: int = 0
    charges: int = 0
    items: int = 0
    payments: int = 0
    matched: int = 0
    skipped: int = 0  # CSV rows of other teams' instances on a shared Vast account


@dataclass(frozen=True)
class ChargeRecord:
    """One contract's charges on one day, from the API or a CSV file (the same shape)."""

    source: str
    day: date
    type: str
    label: str
    description: str
    start: datetime | None
    end: datetime | None
    amount: Decimal
    items: tuple[vast.ChargeItem, ...]

    @property
    def instance_id(self) -> int | None:
        prefix = "instance-"
        rest = self.source[len(prefix) :] if self.source.startswith(prefix) else ""
        return int(rest) if rest.isdigit() else None


def store_charges(team, records: Iterable[ChargeRecord], *, origin: str, now: datetime) -> int:
    """Upsert RECORDS on (team, source, day), replacing their items; returns the item count.

    Call inside a transaction: a charge and its items are replaced together."""
    n_items = 0
    for record in records:
        check_in_range(record)
        charge, _ = Charge.objects.update_or_create(
            team=team,
            source=record.source,
            day=record.day,
            defaults={
                "instance_id": record.instance_id,
                "type": record.type,
                "label": record.label[:300],
                "description": record.description[:300],
                "start": record.start,
                "end": record.end,
                "amount": record.amount,
                "origin": origin,
                "imported_at": now,
            },
        )
        charge.items.all().delete()
        ChargeItem.objects.bulk_create(
            ChargeItem(
                charge=charge,
                position=n,
                type=item.type or "",
                description=item.description[:300],
                amount=item.amount,
                quantity=item.quantity,
                unit=item.unit or "",
                rate=item.rate,
                rate_unit=item.rate_unit or "",
            )
            for n, item in enumerate(record.items)
        )
        n_items += len(record.items)
    return n_items


def check_in_range(record: ChargeRecord) -> None:
    """Refuse (ValueError) a record whose numbers no column can hold: PostgreSQL would refuse
    the row, and SQLite would store it and then fail every read of it."""
    numbers = [(Charge, "amount", record.amount)]
    for item in record.items:
        numbers += [
            (ChargeItem, name, getattr(item, name)) for name in ("amount", "quantity", "rate")
        ]
    for model, name, value in numbers:
        if value is None:
            continue
        field = model._meta.get_field(name)
        whole_digits = field.max_digits - field.decimal_places
        if not Decimal(value).is_finite() or abs(Decimal(value)) >= Decimal(10) ** whole_digits:
            raise ValueError(f"{name} {value} is out of range")


def charge_filter(team):
    """Which of the account's charges are TEAM's.

    A team with its own Vast key owns its account: every charge is its own, and one with no
    attempt is an unmatched charge. Teams on the server's shared key (``VAST_API_KEY``) see
    only charges for their own attempts' instances; orphans on the shared account belong to
    no team (the orphan reaper destroys them; the server admin sees them at Vast)."""
    if team.vast_api_key:
        return lambda charge: True
    mine = set(
        Attempt.objects.filter(job__team=team, instance_id__isnull=False).values_list(
            "instance_id", flat=True
        )
    )
    # A hedged rent's losers (jobs.models.racer) are the team's instances too.
    mine |= set(
        Racer.objects.filter(attempt__job__team=team, instance_id__isnull=False).values_list(
            "instance_id", flat=True
        )
    )
    return lambda charge: charge.instance_id in mine
