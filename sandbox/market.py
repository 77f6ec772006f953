"""The offer market: a JSON list of Vast offers, searched with Vast's query language.

Offer files follow ``market/README.md``: Vast field names and units plus hidden
``sim_*`` keys (``sim_speed_factor``) that only the simulator reads; those are never served.
Query-dependent columns (``dph_total``, ``storage_total_cost``, ``score``, the ``search``
price object) are computed per search from ``allocated_storage`` and the rental ``type``,
as ``docs/vast-api.md`` §2 describes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.query import QueryError, matches, sort_rows

DEFAULT_MARKET = Path(__file__).resolve().parent / "market" / "offers.json"
# Vast documents neither the default nor the maximum of `limit`; 64 makes a client that
# forgets `limit` notice that it sees only part of the market. [INF]
DEFAULT_LIMIT = 64
MAX_LIMIT = 10_000
# The docs say 8 GB when the client sends no allocated_storage; the SDK always sends 5.
DEFAULT_STORAGE_GB = 8.0
HOURS_PER_MONTH = 720.0  # Vast prices storage per 30-day month
TYPES = {"on-demand": "on-demand", "ondemand": "on-demand", "bid": "bid", "reserved": "reserved"}
# Share of asks already taken by other tenants when --seed is given.
SEEDED_RENTED_SHARE = 0.15
# Keys the SDK forwards that change nothing here.
IGNORED_KEYS = {
    "disable_bundling",
    "extra_ids",
    "show_incompatible",
    "sort_option",
    "gpu_option",
    "template_id",
}
ALIASES = {
    "reliability2": "reliability",
    "dphtotal": "dph_total",
    "ubuntu_version": "os_version",
    "expected_reliability": "reliability",
    "cuda_vers": "cuda_max_good",
}
# Plausible constants for columns the market file does not carry, so filters on them work.
DEFAULTS = {"cpu_arch": "amd64", "gpu_arch": "nvidia", "has_avx": 1, "external": False}


def load_offers(path: Path) -> list[dict]:
    """The offers of a market file (a JSON list, or ``{"offers": [...]}``)."""
    data = json.loads(Path(path).read_text())
    offers = data["offers"] if isinstance(data, dict) else data
    if not isinstance(offers, list) or not all(isinstance(o, dict) and "id" in o for o in offers):
        raise ValueError(f"{path}: expected a list of offer objects with an 'id'")
    return offers


def public(offer: dict) -> dict:
    """The offer as Vast would show it: without the simulator's ``sim_*`` keys."""
    return {k: v for k, v in offer.items() if not k.startswith("sim_")}


def numeric_version(version: str | None) -> int | None:
    """``"535.86.05"`` → 535086005, the form the CLI sends for driver_version filters."""
    try:
        major, minor, patch = str(version).split(".")
        return int(f"{major.zfill(3)}{minor.zfill(3)}{patch.zfill(3)}")
    except ValueError:
        return None


class Market:
    """All offers of a market file, plus the asks already rented by other tenants."""

    def __init__(self, offers: list[dict], seed: int | None = None) -> None:
        self.offers = {int(o["id"]): o for o in offers}
        self.seed = seed
        self.taken_by_others = self._seeded_taken(seed)

    @classmethod
    def from_file(cls, path: Path | None, seed: int | None = None) -> Market:
        return cls(load_offers(path or DEFAULT_MARKET), seed)

    def _seeded_taken(self, seed: int | None) -> frozenset[int]:
        if seed is None:
            return frozenset()
        rng = random.Random(seed)
        ids = sorted(self.offers)
        return frozenset(rng.sample(ids, round(len(ids) * SEEDED_RENTED_SHARE)))

    def get(self, ask_id: int) -> dict | None:
        return self.offers.get(ask_id)

    def speed_factor(self, ask_id: int) -> float:
        """The hidden slowness of the machine behind an ask (1.0 = normal)."""
        return float(self.offers.get(ask_id, {}).get("sim_speed_factor", 1.0))

    def search(
        self,
        query: dict,
        rented: set[int],
        gone: set[int],
        now: float,
        min_bid: Callable[[int], float] | None = None,
    ) -> list[dict]:
        """Offers matching a Vast search query, priced for its storage and type; MIN_BID gives
        an ask's current ``min_bid`` (the interruptible market's, ``bids``), else the file's."""
        q = dict(query or {})
        order = q.pop("order", [["score", "desc"]]) or []
        limit = _limit(q.pop("limit", None))
        kind = TYPES.get(str(q.pop("type", "on-demand")))
        if kind is None:
            raise QueryError("type must be one of on-demand, ondemand, bid, reserved")
        storage = _float(q.pop("allocated_storage", None), DEFAULT_STORAGE_GB)
        for key in IGNORED_KEYS:
            q.pop(key, None)
        if "target_reliability" in q:
            q["reliability"] = {"gte": q.pop("target_reliability")}
        rows = []
        for ask_id, offer in self.offers.items():
            # allocated_storage doubles as a disk_space >= filter [SDK comments]
            if ask_id in gone or float(offer.get("disk_space", 0)) < storage:
                continue
            taken = ask_id in rented or ask_id in self.taken_by_others
            floor = min_bid(ask_id) if min_bid is not None else None
            row = offer_row(offer, storage, kind, taken, now, floor)
            if matches(lambda field, row=row: _virtual(row, field, q.get(field)), q):
                rows.append(row)
        keys = [(ALIASES.get(str(f), str(f)), d) for f, d in _order_pairs(order)]
        return sort_rows(rows, keys)[:limit]


def offer_row(
    offer: dict,
    storage_gb: float,
    kind: str,
    rented: bool,
    now: float,
    min_bid: float | None = None,
) -> dict:
    """One served offer: the public fields plus the query-dependent ones."""
    row = {**DEFAULTS, **public(offer)}
    if min_bid is not None:
        row["min_bid"] = min_bid
    gpu_price = float(row["min_bid"] if kind == "bid" else offer["dph_base"])
    storage_hour = float(offer.get("storage_cost", 0.0)) * storage_gb / HOURS_PER_MONTH
    total = gpu_price + storage_hour
    prices = {
        "gpuCostPerHour": gpu_price,
        "diskHour": storage_hour,
        "totalHour": total,
        "discountTotalHour": 0.0,
        "discountedTotalPerHour": total,
    }
    dlperf = offer.get("dlperf")
    row.update(
        dph_total=total,
        storage_total_cost=storage_hour,
        dlperf_per_dphtotal=(dlperf / total) if dlperf and total else None,
        flops_per_dphtotal=(offer["total_flops"] / total) if offer.get("total_flops") else None,
        # Vast's score formula is not published; this one ranks value for money and trust.
        score=(dlperf / total) * float(offer.get("reliability", 0)) if dlperf and total else 0.0,
        rentable=not rented,
        rented=rented,
        is_bid=kind == "bid",
        bundle_id=offer["id"],
        driver_vers=numeric_version(offer.get("driver_version")),
        start_date=now,
        end_date=now + float(offer.get("duration", 0.0)),
        search=prices,
        instance=dict(prices),
    )
    return row


def _virtual(row: dict, field: str, ops: Any) -> Any:
    """The value a filter on ``field`` compares against (virtual columns resolved)."""
    if field == "verified":
        return row.get("verification") == "verified"
    if field == "datacenter":
        return row.get("hosting_type") == 1
    if field == "geolocation" and _all_country_codes(ops):
        return str(row.get("geolocation") or "").rsplit(",", 1)[-1].strip() or None
    if field == "driver_version" and not _all_strings(ops):
        return row.get("driver_vers")
    if field.endswith("_GB") and field[:-3] in ("cpu_ram", "gpu_ram", "gpu_total_ram"):
        value = row.get(field[:-3])
        return value / 1000.0 if value is not None else None
    return row.get(ALIASES.get(field, field))


def _wanted_values(ops: Any) -> list:
    values = []
    for v in _ops(ops).values():
        values.extend(v if isinstance(v, list | tuple) else [v])
    return values


def _all_country_codes(ops: Any) -> bool:
    values = _wanted_values(ops)
    return bool(values) and all(isinstance(v, str) and len(v.strip()) == 2 for v in values)


def _all_strings(ops: Any) -> bool:
    return all(isinstance(v, str) and "." in v for v in _wanted_values(ops))


def _ops(ops: Any) -> dict:
    return ops if isinstance(ops, dict) else {"eq": ops}


def _order_pairs(order: Any) -> list[tuple[str, str]]:
    if not isinstance(order, list) or not all(
        isinstance(p, list | tuple) and len(p) == 2 for p in order
    ):
        raise QueryError("order must be a list of [field, 'asc'|'desc'] pairs")
    return [(str(f), str(d)) for f, d in order]


def _limit(value: Any) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        return max(1, min(int(value), MAX_LIMIT))
    except (TypeError, ValueError) as exc:
        raise QueryError("limit must be an integer") from exc


def _float(value: Any, default: float) -> float:
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise QueryError("allocated_storage must be a number") from exc
