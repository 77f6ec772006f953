"""Billing as Vast bills (``docs/vast-api.md`` §6-7), computed from recorded usage.

The engine records *intervals* (GPU billed, storage billed) and *traffic* (bytes with a
timestamp); nothing is accrued in place. Any day's charges, and an account's credit, are
integrals over those records, so charges come out consistent with the credit, and a restart
loses nothing.

Charges come in *day rows keyed at 00:00 UTC*, as Vast's ``show_charges`` spec shows them
(``vast-ai/docs`` ``api-reference/openapi/yaml/show_charges.yaml``): its example result has
``start`` 2024-11-01 00:00 and ``end`` 2024-11-04 00:00, exact midnights, described as "Charges -
4 days" with a "96.000 hours" GPU item, and its query examples end a day at 23:59:59
(``{"day": {"gte": 1767225600, "lte": 1769903999}}``). So a query's ``day`` filter selects the
day rows whose key (that midnight) lies in ``[gte, lte]``, both inclusive, and a contract's
result sums them, ``start``/``end`` being its first and last day key. Asking ``lte`` = the next
midnight therefore brings the next day's row too.

Rates are fixed per instance when it is created (copied from the offer): GPU $/h
(``dph_base``, or the bid price for interruptible), storage $/h (``storage_cost`` $/GB/month
* disk GB / 720), traffic $/GB each way. The disk item is worded as Vast's billing page words
it, "0.9765233 hours at $0.018/hour": the hours the disk existed at the whole disk's rate.
A changed bid (``PUT /instances/bid_price/{id}/``) prices the GPU hours after it only: each GPU
interval carries its own ``rate`` (NULL in older state files: the instance's ``gpu_rate``), and
the GPU item's "at $x/hour" is the average.
A GB of traffic is 1024³ bytes: the offers' ``inet_*_cost`` are the hosts' $/TB prices divided
by 1024. An ``overcharge`` injection multiplies the *billed quantities* of that contract, so
its invoice stays self-consistent (quantity * rate = amount) but exceeds what was used.
Payments (``GET /api/v1/invoices/``) are ``payments.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from sandbox.query import QueryError, check_ops, compare
from sandbox.state import Store

GB = 1024**3
DAY_S = 86_400
CHARGES_DEFAULT_LIMIT, CHARGES_MAX_LIMIT = 100, 500
DAY_MISSING = "Must provide both 'day' gte and lte filters in select_filters (unix timestamps)."


class BillingError(ValueError):
    """A bad request to a billing endpoint (400 for charges)."""

    def __init__(self, msg: str, error: str = "invalid_args") -> None:
        super().__init__(msg)
        self.error = error


@dataclass
class Usage:
    """What one contract used inside a window, and when."""

    gpu_s: float = 0.0
    gpu_usd: float = 0.0  # GPU seconds times their interval's $/h, / 3600
    disk_s: float = 0.0
    down: int = 0
    up: int = 0
    first: float | None = None
    last: float | None = None

    def touch(self, a: float, b: float) -> None:
        self.first = a if self.first is None else min(self.first, a)
        self.last = b if self.last is None else max(self.last, b)

    def empty(self) -> bool:
        return not (self.gpu_s > 0 or self.disk_s > 0 or self.down or self.up)


def window_usage(
    store: Store, instance_id: int, lo: float, hi: float, now: float, *, open_end: bool = False
) -> Usage:
    """Usage of one instance clipped to [lo, hi] (open intervals run until ``now``); with
    OPEN_END, traffic at exactly HI is left to the next window (day rows never share a byte)."""
    usage = Usage()
    for r in store.rows(
        "SELECT u.kind, u.start, u.stop, COALESCE(u.rate, i.gpu_rate) AS rate FROM usage u"
        " JOIN instances i ON i.id = u.instance_id WHERE u.instance_id = ? AND u.start <= ?"
        " AND (u.stop IS NULL OR u.stop >= ?)",
        (instance_id, hi, lo),
    ):
        a, b = max(r["start"], lo), min(r["stop"] if r["stop"] is not None else now, hi)
        if b <= a:
            continue
        usage.touch(a, b)
        if r["kind"] == "gpu":
            usage.gpu_s += b - a
            usage.gpu_usd += (b - a) / 3600.0 * r["rate"]
        else:
            usage.disk_s += b - a
    for r in store.rows(
        "SELECT direction, SUM(bytes) AS n, MIN(ts) AS a, MAX(ts) AS b FROM traffic"
        " WHERE instance_id = ? AND ts >= ? AND (ts < ? OR (ts = ? AND NOT ?)) GROUP BY direction",
        (instance_id, lo, hi, hi, open_end),
    ):
        usage.touch(r["a"], r["b"])
        setattr(usage, "down" if r["direction"] == "down" else "up", int(r["n"]))
    return usage


def item_costs(inst: dict, usage: Usage) -> dict[str, tuple[float, float, str]]:
    """Per category: (billed quantity, amount in $, description), overcharge applied."""
    mult = 1.0 + float(inst["overcharge"]) / 100.0
    gpu_h = usage.gpu_s / 3600.0 * mult
    gpu_usd = usage.gpu_usd * mult
    gpu_rate = gpu_usd / gpu_h if gpu_h > 0 else inst["gpu_rate"]
    disk_h = usage.disk_s / 3600.0 * mult
    down_gb, up_gb = usage.down / GB * mult, usage.up / GB * mult
    return {
        "gpu": (gpu_h, gpu_usd, f"{gpu_h:.3f} hours at ${gpu_rate:.3f}/hour"),
        "disk": (
            disk_h,
            disk_h * inst["disk_rate"],
            f"{disk_h:.7f} hours at ${_hourly(inst['disk_rate'])}/hour",
        ),
        "bwd": (
            down_gb,
            down_gb * inst["down_rate"],
            f"{down_gb:.3f} GB downloaded at ${inst['down_rate']:.6f}/GB",
        ),
        "bwu": (
            up_gb,
            up_gb * inst["up_rate"],
            f"{up_gb:.3f} GB uploaded at ${inst['up_rate']:.6f}/GB",
        ),
    }


def _hourly(rate: float) -> str:
    """A $/hour rate as Vast's billing page prints one ("$0.018/hour"), 3 decimals; a rate with
    more digits keeps up to 6, so quantity times rate still gives the amount (how Vast prints
    such a rate is not known)."""
    text = f"{rate:.6f}".rstrip("0")
    return text if len(text.split(".")[1]) >= 3 else f"{rate:.3f}"


def day_keys(lo: float, hi: float) -> range:
    """The day rows a ``day: {gte: LO, lte: HI}`` filter selects: the UTC midnights in [LO, HI]."""
    first = -(-int(lo) // DAY_S) * DAY_S  # the first midnight at or after LO
    return range(first, int(hi) + 1, DAY_S)


def days_usage(store: Store, instance_id: int, lo: float, hi: float, now: float) -> Usage:
    """Usage of one instance summed over the day rows selected by [LO, HI], with ``first`` and
    ``last`` set to the first and last day key that has any (Vast's ``start``/``end``)."""
    total = Usage()
    for key in day_keys(lo, hi):
        day = window_usage(store, instance_id, key, key + DAY_S, now, open_end=True)
        if day.empty():
            continue
        total.gpu_s, total.disk_s = total.gpu_s + day.gpu_s, total.disk_s + day.disk_s
        total.gpu_usd += day.gpu_usd
        total.down, total.up = total.down + day.down, total.up + day.up
        total.touch(key, key)
    return total


def charge_result(inst: dict, usage: Usage) -> dict[str, Any]:
    """One contract's charges in Vast's ``/api/v0/charges/`` result shape; ``usage.first`` and
    ``usage.last`` are its first and last day keys."""
    start, end = int(usage.first or 0), int(usage.last or 0)
    items, total = [], 0.0
    for kind, (quantity, amount, text) in item_costs(inst, usage).items():
        if quantity <= 0:
            continue
        total += amount
        items.append(_entry(start, end, kind, None, text, amount, {}))
    label = inst.get("label")
    metadata = {"label": label} if label else {}
    days = (end - start) // DAY_S + 1
    text = f"Instance {inst['id']} Charges - {days} day{'s' if days != 1 else ''}"
    return _entry(start, end, "instance", f"instance-{inst['id']}", text, total, metadata, items)


def _entry(
    start: int,
    end: int,
    kind: str,
    source: str | None,
    text: str,
    amount: float,
    metadata: dict,
    items: list | None = None,
) -> dict[str, Any]:
    return {
        "start": start,
        "end": end,
        "type": kind,
        "source": source,
        "description": text,
        "amount": round(amount, 3),
        "metadata": metadata,
        "items": items or [],
    }


def billed_total(store: Store, account_id: int, now: float) -> float:
    """Everything an account has been billed so far (what credit is reduced by)."""
    # Two grouped queries instead of two per instance: this runs on every rent and tick.
    args = {"a": account_id, "now": now}
    usage = {
        r["id"]: (r, Usage())
        for r in store.rows("SELECT * FROM instances WHERE account_id = :a", args)
    }
    for r in store.rows(
        "SELECT u.instance_id AS iid, u.kind,"
        " SUM(MIN(COALESCE(u.stop, :now), :now) - u.start) AS s,"
        " SUM((MIN(COALESCE(u.stop, :now), :now) - u.start) * COALESCE(u.rate, i.gpu_rate)) AS c"
        " FROM usage u JOIN instances i ON i.id = u.instance_id"
        " WHERE i.account_id = :a AND u.start <= :now GROUP BY u.instance_id, u.kind",
        args,
    ):
        found = usage[r["iid"]][1]
        if r["kind"] == "gpu":
            found.gpu_s, found.gpu_usd = float(r["s"]), float(r["c"]) / 3600.0
        else:
            found.disk_s = float(r["s"])
    for r in store.rows(
        "SELECT t.instance_id AS iid, t.direction, SUM(t.bytes) AS n FROM traffic t"
        " JOIN instances i ON i.id = t.instance_id WHERE i.account_id = :a AND t.ts <= :now"
        " GROUP BY t.instance_id, t.direction",
        args,
    ):
        setattr(usage[r["iid"]][1], "down" if r["direction"] == "down" else "up", int(r["n"]))
    return sum(
        amount for inst, u in usage.values() for _, amount, _ in item_costs(inst, u).values()
    )


def credit(store: Store, account_id: int, now: float) -> float:
    """Top-ups minus everything billed: the spendable balance ``/users/current`` shows."""
    paid = store.row(
        "SELECT COALESCE(SUM(amount), 0) AS s FROM payments WHERE account_id = ?", (account_id,)
    )
    return float(paid["s"]) - billed_total(store, account_id, now)


def charges(store: Store, account_id: int, params: dict, now: float) -> dict[str, Any]:
    """``GET /api/v0/charges/``: one result per contract, summing its day rows in the window."""
    filters = params.get("select_filters")
    lo, hi = _day_window(filters)
    limit = page_limit(params.get("limit"), CHARGES_DEFAULT_LIMIT, CHARGES_MAX_LIMIT)
    offset = decode_token(params.get("after_token"))
    results = []
    if _type_allowed(filters.get("type")):
        for inst in store.rows(
            "SELECT * FROM instances WHERE account_id = ? AND created_at <= ?"
            " AND (destroyed_at IS NULL OR destroyed_at >= ?)",
            (account_id, hi, lo),
        ):
            usage = days_usage(store, inst["id"], lo, hi, now)
            if not usage.empty():
                results.append((usage.first, inst["id"], charge_result(inst, usage)))
    results.sort(key=lambda r: (r[0], r[1]), reverse=bool(params.get("latest_first")))
    page = [r[2] for r in results[offset : offset + limit]]
    more = offset + limit < len(results)
    return {
        "success": True,
        "count": len(page),
        "total": len(results),
        "next_token": encode_token(offset + limit) if more else None,
        "results": page,
    }


def _day_window(filters: Any) -> tuple[float, float]:
    day = filters.get("day") if isinstance(filters, dict) else None
    if not isinstance(day, dict) or "gte" not in day or "lte" not in day:
        raise BillingError(DAY_MISSING)
    try:
        return float(day["gte"]), float(day["lte"])
    except (TypeError, ValueError) as exc:
        raise BillingError(DAY_MISSING) from exc


def _type_allowed(ops: Any) -> bool:
    """Every sandbox contract is an instance; volumes and serverless do not exist here."""
    if ops is None:
        return True
    try:
        return all(compare("instance", op, v) for op, v in check_ops("type", ops).items())
    except QueryError as exc:
        raise BillingError(str(exc)) from exc


def page_limit(value: Any, default: int, maximum: int) -> int:
    if value is None:
        return default
    try:
        return max(1, min(int(value), maximum))
    except (TypeError, ValueError) as exc:
        raise BillingError("limit must be an integer") from exc


def encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_token(token: Any) -> int:
    """The offset inside an ``after_token``; 400 ``invalid_token`` when it is not ours."""
    if token in (None, ""):
        return 0
    try:
        raw = base64.urlsafe_b64decode(str(token) + "=" * (-len(str(token)) % 4))
        offset = json.loads(raw)["o"]
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise BillingError("invalid after_token", "invalid_token") from exc
    if not isinstance(offset, int) or offset < 0:
        raise BillingError("invalid after_token", "invalid_token")
    return offset
