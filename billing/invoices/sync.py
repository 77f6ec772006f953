"""The periodic sync: ``GET /api/v0/charges/`` one UTC day at a time, every page, and
``GET /api/v1/invoices/`` for payments (``docs/vast-api.md`` §6).

Each day is written in its own transaction together with the sync cursor, so a failure halfway
leaves the finished days in place and the next run resumes at the first unfinished one.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import transaction

from billing.invoices.store import ChargeRecord, ImportResult, charge_filter, store_charges
from billing.models import InvoiceSync, Payment
from billing.reconcile.matching import match_charges
from hosts import vast
from jobs.models import Attempt

logger = logging.getLogger(__name__)

# A day is final (its cursor may pass it) once it ended this long ago: late usage records
# (traffic counters, a host that reconnects) still land on the day they happened.
SETTLE_AFTER = timedelta(hours=6)


def day_window(day: date) -> tuple[datetime, datetime]:
    """The ``day`` filter that asks for DAY's row and nothing else: midnight to 23:59:59 UTC.

    Vast keys each contract's charges by day at 00:00 UTC and ``lte`` is inclusive, so asking
    up to the next midnight would also bring the next day's row (and store that day twice);
    its own examples end a day one second short (``show_charges.yaml``, ``sandbox/README.md``).
    """
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1, seconds=-1)


def days_to_import(sync: InvoiceSync, *, earliest: date, now: datetime) -> list[date]:
    """The days the next sync asks for: from the first unfinished one through today (UTC)."""
    first = earliest
    if sync.charges_complete_through is not None:
        first = max(first, sync.charges_complete_through + timedelta(days=1))
    today = now.astimezone(UTC).date()
    return [first + timedelta(days=n) for n in range((today - first).days + 1)]


def is_settled(day: date, *, now: datetime) -> bool:
    """Whether DAY is over long enough ago that its charges will not change any more."""
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC) + SETTLE_AFTER <= now


def record_from_api(charge: vast.Charge, day: date) -> ChargeRecord:
    return ChargeRecord(
        source=charge.source or f"unknown-{charge.description}"[:80],
        day=day,
        type=charge.type or "",
        label=charge.label or "",
        description=charge.description[:300],
        start=charge.start,
        end=charge.end,
        amount=charge.amount,
        items=charge.items,
    )


def earliest_day(team, *, now: datetime) -> date:
    """Where a team's first sync starts: its first rental, at most ``INVOICE_LOOKBACK_DAYS``
    back (older charges can still come in by CSV)."""
    floor = (now - timedelta(days=settings.INVOICE_LOOKBACK_DAYS)).astimezone(UTC).date()
    first = (
        Attempt.objects.filter(job__team=team, rented_at__isnull=False)
        .order_by("rented_at")
        .values_list("rented_at", flat=True)
        .first()
    )
    return max(floor, first.astimezone(UTC).date()) if first else floor


def sync_team(team, *, now: datetime, client: vast.VastClient | None = None) -> ImportResult:
    """Import TEAM's charges day by day and its payments, then match charges to attempts.

    Safe to run twice and to resume: every day is upserted on natural keys in one transaction
    with the cursor. Provider calls happen outside transactions. Raises on a provider error
    after keeping the days already finished (and records the error on the sync row)."""
    sync, _ = InvoiceSync.objects.get_or_create(team=team)
    own_client = client is None
    belongs = charge_filter(team)
    result = ImportResult()
    unreadable: list[str] = []
    try:
        # Inside the try: a team whose Vast key no longer opens says so on its sync row.
        client = client or vast.VastClient.from_settings(team)
        for day in days_to_import(sync, earliest=earliest_day(team, now=now), now=now):
            lo, hi = day_window(day)
            # The whole day even when it is today: Vast (and the sandbox) bill open usage up
            # to their own clock, and a bound cut at our whole second would drop the last one.
            charges = [c for c in client.charges(lo, hi) if belongs(c)]
            with transaction.atomic():
                items, failed = store_api_charges(team, charges, day, now=now)
                result.items += items
                unreadable += failed
                # A day with a charge that could not be stored is imported again next time:
                # the cursor stops before it (days after it are stored, and asked again).
                if is_settled(day, now=now) and not unreadable:
                    sync.charges_complete_through = day
                    sync.save(update_fields=["charges_complete_through"])
            result.days += 1
            result.charges += len(charges) - len(failed)
        result.payments = import_payments(team, client, since=sync_start(sync, now), now=now)
    except Exception as exc:
        why = str(exc) if isinstance(exc, vast.VastError) else f"{type(exc).__name__}: {exc}"
        InvoiceSync.objects.filter(pk=sync.pk).update(last_run_at=now, last_error=why[:2000])
        raise
    finally:
        if own_client and client is not None:
            client.close()
    InvoiceSync.objects.filter(pk=sync.pk).update(
        last_run_at=now, synced_until=now, last_error="; ".join(unreadable)[:2000]
    )
    result.matched = match_charges(team, now=now)
    return result


def store_api_charges(
    team, charges: list[vast.Charge], day: date, *, now: datetime
) -> tuple[int, list[str]]:
    """Store DAY's CHARGES one by one (each in its own savepoint): one that cannot be stored is
    logged and named in the returned list, and the others are stored all the same. Returns
    the item count and the failures."""
    items, failed = 0, []
    for charge in charges:
        try:
            with transaction.atomic():
                items += store_charges(team, [record_from_api(charge, day)], origin="api", now=now)
        except Exception as exc:
            logger.exception("invoice sync of %s: charge %s of %s failed", team, charge.source, day)
            failed.append(f"charge {charge.source} of {day} could not be stored ({exc})"[:300])
    return items, failed


def sync_start(sync: InvoiceSync, now: datetime) -> datetime:
    """Payments are few: ask for the whole look-back window each time (upserted by id)."""
    return now - timedelta(days=settings.INVOICE_LOOKBACK_DAYS)


def import_payments(team, client: vast.VastClient, *, since: datetime, now: datetime) -> int:
    """Upsert the team's payments and credits since SINCE on (team, invoice id)."""
    rows = [r for r in client.invoices(since, now) if r.invoice_id]
    with transaction.atomic():
        for row in rows:
            Payment.objects.update_or_create(
                team=team,
                invoice_id=row.invoice_id,
                defaults={
                    "type": row.type or "",
                    "service": row.service or "",
                    "source": (row.source or "")[:200],
                    "description": row.description[:300],
                    "created_at": row.created_at,
                    "paid_at": row.paid_at,
                    "amount": row.amount,
                    "imported_at": now,
                },
            )
    return len(rows)
