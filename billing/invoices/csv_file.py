"""The CSV way in and out: finance uploads a charges export (``import_csv``; columns in
``CSV_COLUMNS``), all or nothing, and downloads a period's charges in the same format."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction

from billing.invoices.store import ChargeRecord, ImportResult, charge_filter, store_charges
from billing.models import Charge, ChargeOrigin
from billing.reconcile.matching import match_charges
from hosts import vast

ITEM_TYPES = ("gpu", "disk", "bwd", "bwu")
# One row per charge item, mirroring the fields of a `GET /api/v0/charges/` result and its
# items (``docs/vast-api.md`` §6a); rows with the same (source, day) form one charge.
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
class CsvRejected(Exception):
    """A CSV file with bad rows: nothing was imported. ``errors`` are (line number, message)."""

    errors: list[tuple[int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(f"line {n}: {msg}" for n, msg in self.errors[:20])


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
