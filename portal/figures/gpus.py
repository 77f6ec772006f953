"""The GPUs of an attempt's latest heartbeat, as the job page writes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobs.models import Attempt


@dataclass(frozen=True)
class GpuRow:
    """One GPU of an attempt's latest heartbeat, as the job page writes it."""

    label: str  # "GPU 1"
    bus_id: str
    name: str
    utilization: str  # "97 %", or "—" where nvidia-smi had no value
    memory: str  # "20,123 / 24,564 MiB"
    temperature: str  # "61 °C"
    ecc_errors: str  # uncorrected ECC errors since the driver loaded; "—" without ECC
    error: str  # "lost: GPU is lost. …" for a GPU that fell off the bus; "" when healthy


def gpu_rows(attempt: Attempt | None) -> list[GpuRow]:
    """ATTEMPT's GPUs as its last heartbeat listed them (none before one, or from an agent
    too old to send them)."""
    if attempt is None or not isinstance(attempt.gpus, list):
        return []
    return [gpu_row(g) for g in attempt.gpus if isinstance(g, dict)]


def gpu_row(gpu: Mapping[str, Any]) -> GpuRow:
    index = gpu.get("index")
    used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
    return GpuRow(
        label=f"GPU {index}" if index is not None else "GPU ?",
        bus_id=str(gpu.get("pci_bus_id") or ""),
        name=str(gpu.get("name") or ""),
        utilization=_reading(gpu.get("utilization_pct"), " %"),
        memory=f"{_reading(used, '')} / {_reading(total, ' MiB')}",
        temperature=_reading(gpu.get("temperature_c"), " °C"),
        ecc_errors=_reading(gpu.get("ecc_uncorrected"), ""),
        error=str(gpu.get("error") or ""),
    )


def _reading(value: Any, unit: str) -> str:
    """A whole number with thousands separators and UNIT; "—" when nvidia-smi had none."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return f"{value:,.0f}{unit}"
