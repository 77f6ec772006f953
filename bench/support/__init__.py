"""Helpers shared by the bench scripts (a package, so ``make bench`` does not run it)."""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path


def line(figure: str, value: str, baseline: str, ratio: float) -> str:
    """One figure as every bench prints it: figure, value, baseline, ratio (value / baseline)."""
    return f"{figure:<44} {value:<26} baseline {baseline:<46} ratio {ratio:5.2f}"


def percentile(values: list[float], pct: int) -> float:
    """The PCT-th percentile (inclusive method); the only value of a one-element list."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def keep_or_remove(tmp: Path, *, keep: bool) -> None:
    """A bench's folder when it ends: kept and named (``--keep``), or removed."""
    if keep:
        print(f"kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
