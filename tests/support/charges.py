"""Vast's billing rows as the import stores them: one day's charge of an attempt, item by item."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from billing.models import Charge
from hosts.vast import quantity_and_rate
from tests.support.factories import ChargeFactory, ChargeItemFactory

DAY0 = date(2026, 3, 1)  # the day the reconciliation tests' runs were rented


def bill(attempt, *items: tuple[str, str, str], day: date = DAY0) -> Charge:
    """One day row as Vast keys it: start and end at that day's 00:00 UTC."""
    midnight = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    charge = ChargeFactory(
        team=attempt.job.team,
        source=f"instance-{attempt.instance_id}",
        instance_id=attempt.instance_id,
        day=day,
        start=midnight,
        end=midnight,
        amount=sum(Decimal(a) for _, _, a in items),
        origin="api",
        attempt=attempt,
    )
    for n, (kind, text, amount) in enumerate(items):
        q, unit, rate, rate_unit = quantity_and_rate(text) or (None, "", None, "")
        ChargeItemFactory(
            charge=charge,
            position=n,
            type=kind,
            description=text,
            amount=Decimal(amount),
            quantity=q,
            unit=unit,
            rate=rate,
            rate_unit=rate_unit,
        )
    return charge
