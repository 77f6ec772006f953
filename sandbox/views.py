"""Instances as Vast serves them: one object (``docs/vast-api.md`` §4) and the v1 list.

The v1 list pages with a keyset token: the token holds the sort key of the last row
served, so an instance created or destroyed between two page requests neither repeats nor
shifts a row, as Vast's keyset pagination promises.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any

from sandbox.engine import Engine
from sandbox.engine.core import shown_status
from sandbox.errors import ApiError
from sandbox.query import QueryError, compare_keys, matches, order_signs, sort_rows

PAGE_MAX = 25
PAGE_NONPOSITIVE = 5  # what Vast gives for limit <= 0
# Columns the list may filter and order by; computed ones (dph_total, num_gpus...) give 400.
STORED_COLUMNS = frozenset(
    {
        "id",
        "machine_id",
        "host_id",
        "bundle_id",
        "actual_status",
        "intended_status",
        "cur_state",
        "next_state",
        "label",
        "gpu_name",
        "verification",
        "image_uuid",
        "image_runtype",
        "start_date",
        "end_date",
        "is_bid",
        "geolocation",
        "status_msg",
        "disk_space",
        "template_id",
    }
)


def instance_json(engine: Engine, inst: dict, now: float) -> dict[str, Any]:
    """One instance object with Vast's field names and units."""
    offer, config = json.loads(inst["offer"]), json.loads(inst["config"])
    status = shown_status(inst)
    running = status == "running"
    total = inst["gpu_rate"] + inst["disk_rate"]
    prices = {
        "gpuCostPerHour": inst["gpu_rate"],
        "diskHour": inst["disk_rate"],
        "totalHour": total,
        "discountTotalHour": 0.0,
        "discountedTotalPerHour": total,
    }
    end_date = inst["created_at"] + float(offer.get("duration", 0.0))
    row = {
        "id": inst["id"],
        "machine_id": offer.get("machine_id"),
        "host_id": offer.get("host_id"),
        "bundle_id": inst["ask_id"],
        "actual_status": status,
        "intended_status": inst["intended"],
        "cur_state": _cur_state(inst),
        "next_state": inst["intended"],
        # While an image loads: Docker's pull progress, as Vast relays it (weather_fates.py).
        "status_msg": inst["status_msg"] or engine.loading_msg(inst, now) or None,
        "label": inst["label"],
        "image_uuid": config["image"],
        "image_args": config.get("args") or [],
        "image_runtype": config["runtype"],
        "extra_env": [[k, v] for k, v in config["env"].items()],
        "onstart": config["onstart"],
        "template_id": None,
        "template_hash_id": config.get("template_hash_id"),
        "template_name": None,
        "start_date": inst["created_at"],
        "end_date": end_date,
        "duration": max(end_date - now, 0.0),
        "uptime_mins": _uptime_mins(engine, inst, now),
        "num_gpus": offer.get("num_gpus"),
        "gpu_name": offer.get("gpu_name"),
        "gpu_ram": offer.get("gpu_ram"),
        "gpu_totalram": offer.get("gpu_total_ram"),
        "gpu_arch": "nvidia",
        "gpu_util": _gpu_reading(engine, inst, "gpu_util") if running else None,
        "gpu_temp": 34.0 + 0.4 * (_gpu_reading(engine, inst, "gpu_util") or 0.0)
        if running
        else None,
        "cuda_max_good": offer.get("cuda_max_good"),
        "driver_version": offer.get("driver_version"),
        "cpu_cores": offer.get("cpu_cores"),
        "cpu_cores_effective": offer.get("cpu_cores_effective"),
        "cpu_ram": offer.get("cpu_ram"),
        "cpu_util": 0.0 if running else None,
        "mem_usage": None,
        "mem_limit": None,
        "disk_space": config["disk"],
        "disk_usage": None,
        "disk_util": None,
        "inet_up": offer.get("inet_up"),
        "inet_down": offer.get("inet_down"),
        "public_ipaddr": "127.0.0.1",
        "local_ipaddrs": "127.0.0.1",
        "ssh_host": "127.0.0.1",
        "ssh_port": None,
        "ssh_idx": None,
        "direct_port_start": None,
        "direct_port_end": None,
        "jupyter_token": None,
        "dph_base": inst["gpu_rate"],
        "dph_total": total,
        "storage_cost": offer.get("storage_cost"),
        "storage_total_cost": inst["disk_rate"],
        "inet_up_cost": inst["up_rate"],
        "inet_down_cost": inst["down_rate"],
        "search": prices,
        # Vast shows the live GPU price as 0 while the GPU is not billed (doc example) [INF].
        "instance": {**prices, "gpuCostPerHour": inst["gpu_rate"] if running else 0.0},
        # The machine's min_bid now (the interruptible market's walk, or a winning bid).
        "min_bid": engine.min_bid_now(inst, now) if offer.get("min_bid") is not None else None,
        "is_bid": bool(inst["is_bid"]),
        "reliability2": offer.get("reliability"),
        "verification": offer.get("verification"),
        "geolocation": offer.get("geolocation"),
        "hosting_type": offer.get("hosting_type"),
        "credit_balance": None,
        "credit_discount": None,
        "credit_discount_max": 0.0,
        "time_remaining": "",
        "volume_info": None,
    }
    if running:
        row["ports"] = {}  # present only when running; the sandbox opens no ports
    return row


def _cur_state(inst: dict) -> str:
    if inst["destroyed_at"] is not None:
        return "unloaded"
    return "running" if inst["intended"] == "running" and not inst["outbid"] else "stopped"


def _uptime_mins(engine: Engine, inst: dict, now: float) -> float | None:
    found = engine.store.row(
        "SELECT start FROM usage WHERE instance_id = ? AND kind = 'gpu' AND stop IS NULL",
        (inst["id"],),
    )
    return (now - found["start"]) / 60.0 if found else None


def _gpu_reading(engine: Engine, inst: dict, name: str) -> float | None:
    try:
        return float((Path(engine.scratch(inst["id"])) / name).read_text().strip())
    except (OSError, ValueError):
        return 0.0


def list_instances(engine: Engine, account_id: int, params: dict, now: float) -> dict[str, Any]:
    """``GET /api/v1/instances/``: filtered, ordered, keyset-paged."""
    filters = params.get("select_filters") or {}
    order = _order(params.get("order_by"))
    if not isinstance(filters, dict) or set(filters) - STORED_COLUMNS:
        bad = (
            sorted(set(filters) - STORED_COLUMNS)
            if isinstance(filters, dict)
            else ["select_filters"]
        )
        raise ApiError(400, "invalid_request", f"cannot filter instances on {bad[0]!r}")
    rows = [
        instance_json(engine, inst, now)
        for inst in engine.store.rows(
            "SELECT * FROM instances WHERE account_id = ? AND destroyed_at IS NULL", (account_id,)
        )
    ]
    try:
        rows = sort_rows([r for r in rows if matches(r.get, filters)], order)
    except QueryError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc
    label_counts: dict[str, int] = {}
    for r in rows:
        label_counts[r["label"] or ""] = label_counts.get(r["label"] or "", 0) + 1
    total = len(rows)
    rows = _after(rows, order, params.get("after_token"))
    limit = _page_size(params.get("limit"))
    page = rows[:limit]
    next_token = _token(page[-1], order) if len(rows) > limit else None
    return {
        "success": True,
        "instances_found": len(page),
        "total_instances": total,
        "label_counts": label_counts,
        "next_token": next_token,
        "instances": [_select(r, params.get("select_cols")) for r in page],
    }


def _order(order_by: Any) -> list[tuple[str, str]]:
    """``order_by`` as (col, dir) pairs with ``id`` appended as the tiebreak."""
    specs = order_by if isinstance(order_by, list) else ([order_by] if order_by else [])
    order = []
    for spec in specs:
        if not isinstance(spec, dict) or spec.get("col") not in STORED_COLUMNS:
            raise ApiError(400, "invalid_request", f"cannot order instances by {spec!r}")
        order.append((spec["col"], str(spec.get("dir", "asc"))))
    if "id" not in [c for c, _ in order]:
        order.append(("id", "asc"))
    return order


def _page_size(limit: Any) -> int:
    try:
        value = int(limit) if limit is not None else PAGE_MAX
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_request", "limit must be an integer") from exc
    return PAGE_NONPOSITIVE if value <= 0 else min(value, PAGE_MAX)


def _token(row: dict, order: list[tuple[str, str]]) -> str:
    key = [row.get(col) for col, _ in order]
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _after(rows: list[dict], order: list[tuple[str, str]], token: Any) -> list[dict]:
    """The rows strictly after the token's sort key."""
    if token in (None, ""):
        return rows
    fields, signs = order_signs(order)
    try:
        key = json.loads(base64.urlsafe_b64decode(str(token) + "=" * (-len(str(token)) % 4)))
        if not isinstance(key, list) or len(key) != len(fields):
            raise ValueError("wrong key length")
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, "invalid_token", "after_token is not valid for this query") from exc
    return [r for r in rows if compare_keys([r.get(f) for f in fields], key, signs) > 0]


def _select(row: dict, cols: Any) -> dict:
    if not cols or cols == ["*"] or not isinstance(cols, list):
        return row
    return {c: row.get(c) for c in cols}
