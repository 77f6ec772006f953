"""An offer's or an instance's prices in NomadGPU units: GPU $/h, storage $/GB/h, traffic $/GB.

Several GPUs (issue 31): every price of an offer is the price of the whole instance, all its
``num_gpus`` together, and is never divided or multiplied by the count here or downstream.

- ``dph_base``, ``dph_total``, ``min_bid``: the host types per-GPU prices (vast-ai/vast-cli
  ``list machine``: ``--price_gpu`` "per gpu rental price in $/hour", ``--price_min_bid``
  "per gpu minimum bid price floor in $/hour"), and a machine publishes one offer per slice of
  its GPUs (docs.vast.ai ``guides/concepts``: "one or more offers corresponding to different
  slices of its GPUs"), priced for the slice: the renter's bid is "per machine bid price in
  $/hour" (``create instance --bid_price``, ``change bid --price``). dstack's catalogue
  (dstackai/gpuhunt ``providers/vastai.py``) takes ``dph_base`` + storage and ``min_bid`` as
  the price of an item of ``gpu_count = num_gpus``, untouched. So a search with
  ``num_gpus: {"eq": 4}`` answers 4-GPU slices at 4 x the per-GPU price; ``gpu_frac`` (the
  slice's share of the machine) changes which offers match, not what a price means.
- ``storage_cost``: $/GB/month of the instance's disk (``--price_disk``), per GB allocated,
  not per GPU; ``inet_*_cost``: $/GB moved, not per GPU.
- ``dlperf``, ``gpu_total_ram``, ``cpu_ram``: the whole slice; ``gpu_ram`` is per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hosts.vast.parsing.values import (
    GB_PER_TB,
    HOURS_PER_STORAGE_MONTH,
    divided_or_none,
    float_or_none,
)


def _traffic_usd_per_gb(raw: Mapping[str, Any], direction: str) -> float | None:
    # docs/vast-api.md §2: `inet_*_cost` is $/GB; some answers carry only `internet_*_cost_per_tb`.
    per_gb = float_or_none(raw.get(f"inet_{direction}_cost"))
    if per_gb is not None:
        return per_gb
    return divided_or_none(raw.get(f"internet_{direction}_cost_per_tb"), GB_PER_TB)


def _dph_total(raw: Mapping[str, Any]) -> float | None:
    # docs/vast-api.md §2: dph_total = dph_base + storage_total_cost; fill it in only when both
    # parts are known.
    total = float_or_none(raw.get("dph_total"))
    if total is not None:
        return total
    base, storage = float_or_none(raw.get("dph_base")), float_or_none(raw.get("storage_total_cost"))
    return base + storage if base is not None and storage is not None else None


def price_fields(raw: Mapping[str, Any]) -> dict[str, float | None]:
    """The price fields offers and instances share, in NomadGPU units."""
    return {
        "dph_base": float_or_none(raw.get("dph_base")),
        "dph_total": _dph_total(raw),
        "min_bid": float_or_none(raw.get("min_bid")),
        "storage_usd_per_gb_hour": divided_or_none(
            raw.get("storage_cost"), HOURS_PER_STORAGE_MONTH
        ),
        "download_usd_per_gb": _traffic_usd_per_gb(raw, "down"),
        "upload_usd_per_gb": _traffic_usd_per_gb(raw, "up"),
    }
