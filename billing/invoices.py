"""Importing what Vast billed: charges (per contract per UTC day) and payments/credits.

Two ways in, one store:

- the periodic sync (``sync_team``) asks ``GET /api/v0/charges/`` for one UTC day at a time,
  every page, and ``GET /api/v1/invoices/`` for payments (``shared/vast-api.md`` §6);
- finance uploads a CSV export in the portal (``import_csv``; columns in ``CSV_COLUMNS``).

Both write ``Charge`` rows keyed by (team, source, day), so importing the same day again,
from either way in, replaces the row: re-import is idempotent. Each day is written in its own
transaction together with the sync cursor, so a failure halfway leaves the finished days in
place and the next run resumes at the first unfinished one. A CSV file is all or nothing.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction

from billing.models import Charge, ChargeItem, ChargeOrigin, InvoiceSync, Payment
from billing.reconcile import match_charges, note_billed_traffic
from hosts import vast
from jobs.models import Attempt

logger = logging.getLogger(__name__)

ITEM_TYPES = ("gpu", "disk", "bwd", "bwu")
# A day is final (its cursor may pass it) once it ended this long ago: late usage records
# (traffic counters, a host that reconnects) still land on the day they happened.
SETTLE_AFTER = timedelta(hours=6)
# One row per charge item, mirroring the fields of a `GET /api/v0/charges/` result and its
# items (ref §6a); rows with the same (source, day) form one charge.
CSV_COLUMNS = (
    "day",
    "source",
    "type",
    "label",
    "start",
    "end",
    "description",
    "item_type",
    "item_description",
    "item_amount",
)
CSV_MAX_BYTES = 10 * 1024 * 1024


@dataclass
class ImportResult:
    """What one import did."""

    days: int = 0
    charges: int = 0
    items: int = 0
    payments: int = 0
    matched: int = 0
    skipped: int = 0  # CSV rows of other teams' instances on a shared Vast account


@dataclass
class CsvRejected(Exception):
    """A CSV file with bad rows: nothing was imported. ``errors`` are (line number, message)."""

    errors: list[tuple[int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(f"line {n}: {msg}" for n, msg in self.errors[:20])


# --- the day windows ------------------------------------------------------------------------


def day_window(day: date) -> tuple[datetime, datetime]:
    """The ``day`` filter that asks for DAY's row and nothing else: midnight to 23:59:59 UTC.

    Vast keys each contract's charges by day at 00:00 UTC and ``lte`` is inclusive, so asking
    up to the next midnight would also bring the next day's row (and store that day twice);
    its own examples end a day one second short (``show_charges.yaml``, ``hosts/sandbox/README``).
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


# --- writing charges ------------------------------------------------------------------------


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


# --- the periodic sync ----------------------------------------------------------------------


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
    """Import TEAM's charges day by day and its payments, then match charges to attempts (and
    note each attempt's billed traffic, which its spend counts).

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
    note_billed_traffic(team, now=now)
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
    return lambda charge: charge.instance_id in mine


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


# --- CSV upload -----------------------------------------------------------------------------


def import_csv(team, data: bytes, *, now: datetime) -> ImportResult:
    """Import a charges CSV (``CSV_COLUMNS``) for TEAM: every row valid, or nothing imported.

    Raises ``CsvRejected`` listing each bad row by its line number in the file."""
    parsed = parse_csv(data)
    # An export of the shared account holds other teams' rentals: never this team's charges.
    belongs = charge_filter(team)
    records = [r for r in parsed if belongs(r)]
    with transaction.atomic():
        items = store_charges(team, records, origin=ChargeOrigin.CSV, now=now)
    matched = match_charges(team, now=now)
    note_billed_traffic(team, now=now)
    return ImportResult(
        days=len({r.day for r in records}),
        charges=len(records),
        items=items,
        matched=matched,
        skipped=len(parsed) - len(records),
    )


def parse_csv(data: bytes) -> list[ChargeRecord]:
    """Rows → one ``ChargeRecord`` per (source, day); ``CsvRejected`` if any row is bad."""
    if len(data) > CSV_MAX_BYTES:
        raise CsvRejected([(0, f"file larger than {CSV_MAX_BYTES // 1024 // 1024} MB")])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CsvRejected([(0, "not UTF-8 text")]) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CsvRejected([(1, f"missing columns: {', '.join(missing)}")])
    groups: dict[tuple[str, date], list[tuple[int, dict]]] = {}
    errors: list[tuple[int, str]] = []
    for row in reader:
        line = reader.line_num
        try:
            key = (_required(row, "source"), _parse_day(row["day"]))
        except ValueError as exc:
            errors.append((line, str(exc)))
            continue
        groups.setdefault(key, []).append((line, row))
    records = []
    for (source, day), rows in groups.items():
        try:
            records.append(_record_from_rows(source, day, rows))
        except _RowError as exc:
            errors.append((exc.line, exc.message))
    if errors:
        raise CsvRejected(sorted(errors))
    if not records:
        raise CsvRejected([(1, "no charge rows")])
    return records


class _RowError(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


def _record_from_rows(source: str, day: date, rows: list[tuple[int, dict]]) -> ChargeRecord:
    items = []
    for line, row in rows:
        try:
            items.append(_item_from_row(row))
        except ValueError as exc:
            raise _RowError(line, str(exc)) from None
    line, first = rows[0]
    try:
        start, end = _parse_moment(first["start"]), _parse_moment(first["end"])
    except ValueError as exc:
        raise _RowError(line, str(exc)) from None
    return ChargeRecord(
        source=source[:80],
        day=day,
        type=(first.get("type") or "").strip(),
        label=(first.get("label") or "").strip(),
        description=(first.get("description") or "").strip(),
        start=start,
        end=end,
        amount=sum((i.amount for i in items), Decimal(0)),
        items=tuple(items),
    )


def _item_from_row(row: dict) -> vast.ChargeItem:
    kind = (row.get("item_type") or "").strip()
    if kind not in ITEM_TYPES:
        raise ValueError(f"item_type must be one of {', '.join(ITEM_TYPES)}, not {kind!r}")
    try:
        amount = Decimal((row.get("item_amount") or "").strip())
    except InvalidOperation:
        raise ValueError(f"item_amount is not a number: {row.get('item_amount')!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"item_amount must be a non-negative number, not {amount}")
    return vast.parse_charge_item(
        {"type": kind, "amount": str(amount), "description": row.get("item_description") or ""}
    )


def _required(row: dict, column: str) -> str:
    value = (row.get(column) or "").strip()
    if not value:
        raise ValueError(f"{column} is empty")
    return value


def _parse_day(value: str | None) -> date:
    try:
        return date.fromisoformat((value or "").strip())
    except ValueError:
        raise ValueError(f"day must be YYYY-MM-DD, not {value!r}") from None


def _parse_moment(value: str | None) -> datetime | None:
    """Epoch seconds (as the API sends) or ISO 8601; empty is unknown."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        return datetime.fromtimestamp(float(text), tz=UTC)
    except (ValueError, OverflowError):
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start/end must be epoch seconds or ISO 8601, not {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def export_rows(charges: Iterable[Charge]) -> Iterable[list[str]]:
    """Charges as CSV rows in the upload format (header first): export, edit, upload back."""
    yield list(CSV_COLUMNS)
    for charge in charges:
        for item in charge.items.all():
            yield [
                charge.day.isoformat(),
                charge.source,
                charge.type,
                charge.label,
                str(int(charge.start.timestamp())) if charge.start else "",
                str(int(charge.end.timestamp())) if charge.end else "",
                charge.description,
                item.type,
                item.description,
                str(item.amount),
            ]
