"""What a market search returns: one offer of ``POST /bundles/`` → ``Offer``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hosts.vast.parsing.prices import price_fields
from hosts.vast.parsing.values import (
    MIB_PER_GIB,
    bool_or_none,
    divided_or_none,
    first_present,
    float_or_none,
    int_or_none,
    mapping_field,
    str_or_none,
)


@dataclass(frozen=True)
class Offer:
    """One rentable offer (`POST /bundles/`), in NomadGPU units (``values`` has the table)."""

    id: int
    machine_id: int | None
    host_id: int | None
    gpu_name: str
    num_gpus: int
    gpu_ram_gb: float | None
    gpu_total_ram_gb: float | None
    cpu_cores_effective: float | None
    cpu_ram_gb: float | None
    disk_space_gb: float | None
    cuda_max_good: float | None
    compute_cap: int | None
    dph_base: float | None
    dph_total: float | None
    min_bid: float | None
    storage_usd_per_gb_hour: float | None
    download_usd_per_gb: float | None
    upload_usd_per_gb: float | None
    inet_down_mbps: float | None
    inet_up_mbps: float | None
    reliability: float | None
    verified: bool
    datacenter: bool
    dlperf: float | None
    geolocation: str | None
    # Seconds the host's contract still runs (`duration`, docs/vast-api.md §2: "seconds from now
    # → end_date"): an on-demand instance is stopped at its end_date and cannot be restarted.
    duration_s: float | None = None
    raw: Mapping[str, Any] = mapping_field()


def _gpu_total_ram_gb(raw: Mapping[str, Any]) -> float | None:
    total = divided_or_none(raw.get("gpu_total_ram"), MIB_PER_GIB)
    if total is not None:
        return total
    per_gpu, count = (
        divided_or_none(raw.get("gpu_ram"), MIB_PER_GIB),
        int_or_none(raw.get("num_gpus")),
    )
    return per_gpu * count if per_gpu is not None and count is not None else None


def _verified(raw: Mapping[str, Any]) -> bool:
    if raw.get("verified") is not None:
        return bool(bool_or_none(raw.get("verified")))
    return raw.get("verification") == "verified"


def _datacenter(raw: Mapping[str, Any]) -> bool:
    # docs/vast-api.md §2: the SDK derives `datacenter` from `hosting_type == 1` client-side.
    if raw.get("datacenter") is not None:
        return bool(bool_or_none(raw.get("datacenter")))
    return int_or_none(raw.get("hosting_type")) == 1


def parse_offer(raw: Mapping[str, Any]) -> Offer:
    """One offer object from `POST /bundles/` → `Offer`."""
    return Offer(
        id=int_or_none(raw.get("id")) or 0,
        machine_id=int_or_none(raw.get("machine_id")),
        host_id=int_or_none(raw.get("host_id")),
        gpu_name=str(raw.get("gpu_name") or ""),
        num_gpus=int_or_none(raw.get("num_gpus")) or 0,
        gpu_ram_gb=divided_or_none(raw.get("gpu_ram"), MIB_PER_GIB),
        gpu_total_ram_gb=_gpu_total_ram_gb(raw),
        cpu_cores_effective=float_or_none(raw.get("cpu_cores_effective")),
        cpu_ram_gb=divided_or_none(raw.get("cpu_ram"), MIB_PER_GIB),
        disk_space_gb=float_or_none(raw.get("disk_space")),
        cuda_max_good=float_or_none(raw.get("cuda_max_good")),
        compute_cap=int_or_none(raw.get("compute_cap")),
        **price_fields(raw),
        inet_down_mbps=float_or_none(raw.get("inet_down")),
        inet_up_mbps=float_or_none(raw.get("inet_up")),
        reliability=float_or_none(first_present(raw, "reliability", "reliability2")),
        verified=_verified(raw),
        datacenter=_datacenter(raw),
        dlperf=float_or_none(raw.get("dlperf")),
        geolocation=str_or_none(raw.get("geolocation")),
        duration_s=float_or_none(raw.get("duration")),
        raw=dict(raw),
    )
