"""One raw Vast value → a NomadGPU value: numbers, strings, times, and the units they are in.

Units: one convention for everything ``hosts.vast`` returns, whatever Vast sent.

=====================  ==============================================================
quantity               unit in NomadGPU (Vast field → conversion)
=====================  ==============================================================
compute price          USD per hour, float (``dph_base``, ``dph_total``, ``min_bid``, bids)
storage price          USD per GB per hour, float (``storage_cost`` is $/GB/month; ÷ 720,
                       Vast's 30-day month, docs/vast-api.md §2 and §7)
traffic price          USD per GB, float (``inet_down_cost``/``inet_up_cost``; when only
                       ``internet_*_cost_per_tb`` is present: ÷ 1024, docs/vast-api.md §2)
bandwidth              Mbit/s (``inet_down``/``inet_up``; the CLI/UI reading, where the
                       OpenAPI says MB/s: docs/vast-api.md §2, a conflict)
memory                 GB, meaning GiB: Vast's RAM "MB" fields are MiB, ÷ 1024
disk                   GB as Vast sends it (``disk_space``)
time                   aware UTC ``datetime`` (Vast sends epoch seconds)
ledger amounts         ``Decimal`` USD as Vast rounds them (charges, invoices)
=====================  ==============================================================

Missing or null fields become ``None`` (never a guessed zero), except ledger amounts (``0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

HOURS_PER_STORAGE_MONTH = 720  # docs/vast-api.md §2: storage_total_cost = storage_cost * GB / 720
MIB_PER_GIB = 1024
# $/TB prices ÷ 1024 give the $/GB field (docs/vast-api.md §2): a real offer whose traffic is
# priced at $2.0/TB carries `inet_*_cost` 0.001953125.
GB_PER_TB = 1024


def mapping_field() -> Any:
    """A dict attribute of a frozen result: kept out of repr, equality and hashing."""
    return field(default_factory=dict, repr=False, compare=False, hash=False)


def float_or_none(value: Any) -> float | None:
    """A finite number, or None for a missing, boolean, non-numeric or infinite value."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def int_or_none(value: Any) -> int | None:
    """``float_or_none``, truncated to an int."""
    number = float_or_none(value)
    return int(number) if number is not None else None


def str_or_none(value: Any) -> str | None:
    """The value as a string, None kept."""
    return str(value) if value is not None else None


def bool_or_none(value: Any) -> bool | None:
    """A flag; a string counts as true when it reads 1, true or yes. None kept."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def decimal_or_none(value: Any) -> Decimal | None:
    """A finite ``Decimal`` (thousands commas dropped), or None for a missing or junk value."""
    if value is None or isinstance(value, bool):
        return None
    try:
        result = Decimal(str(value).replace(",", ""))
    except InvalidOperation:
        return None
    return result if result.is_finite() else None


def divided_or_none(value: Any, divisor: float) -> float | None:
    """``float_or_none(value) / divisor``: a unit conversion that keeps None."""
    number = float_or_none(value)
    return number / divisor if number is not None else None


def utc_from_epoch(value: Any) -> datetime | None:
    """Epoch seconds (number or numeric string) → aware UTC datetime; junk → None."""
    seconds = float_or_none(value)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def epoch_seconds(moment: datetime) -> int:
    """Aware datetime → whole epoch seconds (naive datetimes are refused: which zone?)."""
    if moment.tzinfo is None:
        raise ValueError("Vast windows need aware datetimes (UTC)")
    return int(moment.timestamp())


def first_present(raw: Mapping[str, Any], *keys: str) -> Any:
    """The value of the first of KEYS that RAW holds and is not null, else None."""
    return next((raw[k] for k in keys if raw.get(k) is not None), None)
