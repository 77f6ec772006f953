"""What Vast's ledger says: the charges of each contract (``Charge``), payments and credits
(``InvoiceRow``) and the account's credit (``VastUser``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from hosts.vast.parsing.values import (
    HOURS_PER_STORAGE_MONTH,
    decimal_or_none,
    float_or_none,
    int_or_none,
    mapping_field,
    str_or_none,
    utc_from_epoch,
)


@dataclass(frozen=True)
class ChargeItem:
    """One category of a charge (`gpu`, `disk`, `bwd`, `bwu`).

    Vast gives quantity and rate only inside `description` (docs/vast-api.md §6a); they are None
    when the wording is not recognised. `rate` is USD per `rate_unit` (e.g. "hour", "GB",
    "GB-hour"); a storage item in "hours" at $/"hour" is the whole disk's time and rate, not per
    GB.
    """

    type: str | None
    amount: Decimal
    description: str
    quantity: Decimal | None
    unit: str | None
    rate: Decimal | None
    rate_unit: str | None


@dataclass(frozen=True)
class Charge:
    """One contract's charges in the window (`GET /api/v0/charges/`, docs/vast-api.md §6a)."""

    source: str | None
    instance_id: int | None
    label: str | None
    type: str | None
    start: datetime | None
    end: datetime | None
    amount: Decimal
    description: str
    items: tuple[ChargeItem, ...]
    raw: Mapping[str, Any] = mapping_field()


@dataclass(frozen=True)
class InvoiceRow:
    """A payment or credit (`GET /api/v1/invoices/`, docs/vast-api.md §6b).

    Sign: ``amount`` is positive for money paid into the account (a top-up) and negative for
    money leaving it. Vast's raw JSON has it the other way round for every type except
    `transfer`/`payout` (its $25 top-up is -25.0); we flip those like the CLI does for display.
    ``raw_amount`` keeps Vast's number.
    """

    invoice_id: str | None
    type: str | None
    service: str | None
    source: str | None
    description: str
    created_at: datetime | None
    paid_at: datetime | None
    amount: Decimal
    raw_amount: Decimal
    raw: Mapping[str, Any] = mapping_field()


@dataclass(frozen=True)
class VastUser:
    """The account behind the key (`GET /users/current`). `credit` is the spendable USD."""

    id: int | None
    email: str | None
    username: str | None
    credit: float | None
    balance: float | None
    raw: Mapping[str, Any] = mapping_field()


_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# docs/vast-api.md §6a: "96.000 hours at $0.389/hour"; also "12.3 GB downloaded at $0.0005/GB".
# Vast's billing page words a storage item the same way, "0.9765233 hours at $0.018/hour": the
# hours the disk existed, at a per-hour rate for the whole disk (not per GB).
_QUANTITY_AT_RATE = re.compile(
    rf"^\s*(?P<quantity>{_NUMBER})\s*(?P<unit>[A-Za-z][\w-]*)(?:\s+[A-Za-z]+)*?"
    rf"\s+at\s+\$\s?(?P<rate>{_NUMBER})\s*(?:/|per\s+)\s*(?P<rate_unit>[\w/-]+)",
    re.IGNORECASE,
)
# Storage quoted per month: "10.0 GB for 2.500 hours at $0.150/GB/month" (the sandbox's wording
# before it took Vast's; kept for charges imported then). Read in our units: GB-hours at
# $/GB-hour (÷ 720).
_STORAGE_AT_MONTHLY_RATE = re.compile(
    rf"^\s*(?P<gb>{_NUMBER})\s*GB\s+for\s+(?P<hours>{_NUMBER})\s*hours?"
    rf"\s+at\s+\$\s?(?P<rate>{_NUMBER})\s*/\s*GB\s*/\s*month",
    re.IGNORECASE,
)
_INSTANCE_SOURCE = re.compile(r"^instance-(\d+)$")


def quantity_and_rate(description: str) -> tuple[Decimal, str, Decimal, str] | None:
    """``(quantity, unit, rate, rate_unit)`` from a charge item's text; None if unrecognised."""
    if match := _STORAGE_AT_MONTHLY_RATE.match(description):
        gb_hours = _num(match["gb"]) * _num(match["hours"])
        return gb_hours, "GB-hours", _num(match["rate"]) / HOURS_PER_STORAGE_MONTH, "GB-hour"
    if match := _QUANTITY_AT_RATE.match(description):
        return _num(match["quantity"]), match["unit"], _num(match["rate"]), match["rate_unit"]
    return None


def _num(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def parse_charge_item(raw: Mapping[str, Any]) -> ChargeItem:
    """One entry of a charge's `items` → `ChargeItem` (quantity/rate only if the text says)."""
    description = str(raw.get("description") or "")
    quantity, unit, rate, rate_unit = quantity_and_rate(description) or (None, None, None, None)
    return ChargeItem(
        type=str_or_none(raw.get("type")),
        amount=decimal_or_none(raw.get("amount")) or Decimal(0),
        description=description,
        quantity=quantity,
        unit=unit,
        rate=rate,
        rate_unit=rate_unit,
    )


def parse_charge(raw: Mapping[str, Any]) -> Charge:
    """One contract row of `GET /api/v0/charges/` → `Charge`."""
    source = str_or_none(raw.get("source"))
    match = _INSTANCE_SOURCE.match(source or "")
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    items = raw.get("items") if isinstance(raw.get("items"), list) else []
    return Charge(
        source=source,
        instance_id=int(match.group(1)) if match else None,
        label=str_or_none(metadata.get("label")),
        type=str_or_none(raw.get("type")),
        start=utc_from_epoch(raw.get("start")),
        end=utc_from_epoch(raw.get("end")),
        amount=decimal_or_none(raw.get("amount")) or Decimal(0),
        description=str(raw.get("description") or ""),
        items=tuple(parse_charge_item(i) for i in items if isinstance(i, Mapping)),
        raw=dict(raw),
    )


# docs/vast-api.md §6b: the CLI shows these types with Vast's sign, and flips every other type.
_INVOICE_TYPES_KEEPING_SIGN = frozenset({"transfer", "payout"})


def parse_invoice_row(raw: Mapping[str, Any]) -> InvoiceRow:
    """One row of `GET /api/v1/invoices/` → `InvoiceRow` (sign convention: see the class)."""
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    row_type = str_or_none(raw.get("type"))
    raw_amount = decimal_or_none(raw.get("amount")) or Decimal(0)
    keeps_sign = row_type in _INVOICE_TYPES_KEEPING_SIGN
    return InvoiceRow(
        invoice_id=str_or_none(metadata.get("invoice_id")),
        type=row_type,
        service=str_or_none(metadata.get("service")),
        source=str_or_none(raw.get("source")),
        description=str(raw.get("description") or ""),
        created_at=utc_from_epoch(raw.get("start")),
        paid_at=utc_from_epoch(raw.get("end")),
        amount=raw_amount if keeps_sign else -raw_amount,
        raw_amount=raw_amount,
        raw=dict(raw),
    )


def parse_user(raw: Mapping[str, Any]) -> VastUser:
    """`GET /users/current` → `VastUser`."""
    return VastUser(
        id=int_or_none(raw.get("id")),
        email=str_or_none(raw.get("email")),
        username=str_or_none(raw.get("username")),
        credit=float_or_none(raw.get("credit")),
        balance=float_or_none(raw.get("balance")),
        raw=dict(raw),
    )
