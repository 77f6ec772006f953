"""``GET /api/v1/invoices/`` as Vast answers it: the account's payments and credits (here: its
top-ups), filtered by a ``when`` range and ``service``, ordered and paged. What was used and
billed is ``billing.py`` (charges).
"""

from __future__ import annotations

from typing import Any

from sandbox.billing import BillingError, decode_token, encode_token, page_limit
from sandbox.query import check_ops, compare
from sandbox.state import Store

INVOICES_DEFAULT_LIMIT, INVOICES_MAX_LIMIT = 60, 500


def invoices(store: Store, account_id: int, params: dict, now: float) -> dict[str, Any]:
    """``GET /api/v1/invoices/``: payments and credits (here: the top-ups)."""
    filters = params.get("select_filters")
    bounds = _when_bounds(filters)
    if bounds is None:
        return {"success": False, "error": "Invalid date range", "count": 0, "results": []}
    rows = [
        _invoice_row(p)
        for p in store.rows(
            "SELECT * FROM payments WHERE account_id = ? ORDER BY id", (account_id,)
        )
        if all(compare(p["created_at"], op, v) for op, v in bounds.items())
        and _service_ok(p["service"], filters.get("service"))
    ]
    rows.sort(
        key=lambda r: (r["start"], r["metadata"]["invoice_id"]),
        reverse=params.get("latest_first", True) is not False,
    )
    rows = _order_invoices(rows, params.get("order_by"))
    limit = page_limit(params.get("limit"), INVOICES_DEFAULT_LIMIT, INVOICES_MAX_LIMIT)
    offset = decode_token(params.get("after_token"))
    page = rows[offset : offset + limit]
    more = offset + limit < len(rows)
    return {
        "success": True,
        "count": len(page),
        "total": len(rows),
        "next_token": encode_token(offset + limit) if more else None,
        "results": page,
    }


def _when_bounds(filters: Any) -> dict[str, float] | None:
    """The ``when`` range ops, or None when it lacks a lower or an upper bound."""
    when = filters.get("when") if isinstance(filters, dict) else None
    if not isinstance(when, dict) or not set(when) <= {"gte", "gt", "lte", "lt"}:
        return None
    try:
        bounds = {op: float(v) for op, v in when.items()}
    except (TypeError, ValueError):
        return None
    lower = [v for op, v in bounds.items() if op in ("gte", "gt")]
    upper = [v for op, v in bounds.items() if op in ("lte", "lt")]
    if not lower or not upper or max(lower) > min(upper):
        return None
    return bounds


def _service_ok(service: str, ops: Any) -> bool:
    if ops is None:
        return True
    return all(compare(service, op, v) for op, v in check_ops("service", ops).items())


def _invoice_row(payment: dict) -> dict[str, Any]:
    # Sign: Vast's own example shows a $25 Stripe top-up as -25.0 and the CLI flips the sign
    # of every type but transfer/payout for display, so a deposit is negative here too.
    return {
        "start": int(payment["created_at"]),
        "end": int(payment["created_at"]),
        "type": "credit",
        "source": "stripe",
        "description": payment["description"],
        "amount": -float(payment["amount"]),
        "metadata": {"invoice_id": payment["id"], "service": payment["service"]},
        "items": [],
    }


def _order_invoices(rows: list[dict], order_by: Any) -> list[dict]:
    """Explicit ``order_by`` on when / paid_on / amount_cents overrides ``latest_first``."""
    if not order_by:
        return rows
    keys = {"when": "start", "paid_on": "end", "amount_cents": "amount"}
    for spec in reversed(order_by if isinstance(order_by, list) else [order_by]):
        col, direction = (
            (spec.get("col"), spec.get("dir", "asc")) if isinstance(spec, dict) else spec
        )
        if col not in keys:
            raise BillingError(f"cannot order invoices by {col!r}", "invalid_request")
        rows = sorted(
            rows,
            key=lambda r, k=keys[col]: abs(r[k]) if k == "amount" else r[k],
            reverse=str(direction).lower() == "desc",
        )
    return rows
