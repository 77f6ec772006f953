"""Vast's filter language: ``{"field": {"op": value, ...}, ...}``.

Used by offer search, the instance list's ``select_filters`` and the billing endpoints.
Values arrive as JSON, but the official CLI sends most of them as strings (``"0.98"``,
``"True"``, ``"RTX 4090"``), so every comparison coerces the wanted value to the type of
the stored one, as a typed database column would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

OPS = frozenset({"eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"})


class QueryError(ValueError):
    """A malformed filter or order; the API answers 400."""


def coerce(wanted: Any, like: Any) -> Any:
    """``wanted`` converted to the type of ``like`` (the stored value), when it can be."""
    if isinstance(like, bool):
        if isinstance(wanted, str):
            return wanted.strip().lower() in {"true", "1", "yes"}
        return bool(wanted)
    if isinstance(like, int | float) and isinstance(wanted, str):
        try:
            return float(wanted)
        except ValueError:
            return wanted
    if isinstance(like, str) and not isinstance(wanted, str) and wanted is not None:
        return str(wanted)
    return wanted


def compare(actual: Any, op: str, wanted: Any) -> bool:
    """One ``actual <op> wanted`` test. A missing value (None) behaves like SQL NULL."""
    if op in ("in", "notin"):
        items = wanted if isinstance(wanted, list | tuple) else [wanted]
        found = actual is not None and any(actual == coerce(w, actual) for w in items)
        return found if op == "in" else (actual is not None and not found)
    if actual is None:
        return op == "eq" and wanted is None
    wanted = coerce(wanted, actual)
    try:
        return _ORDERED[op](actual, wanted)
    except TypeError:
        return False  # a string against a number: no row matches, like a typed column


_ORDERED: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}


def check_ops(field: str, ops: Any) -> dict[str, Any]:
    """The ops mapping of one field, validated. A bare value means ``eq``."""
    if not isinstance(ops, dict):
        return {"eq": ops}
    unknown = set(ops) - OPS
    if unknown:
        raise QueryError(f"unknown operator {sorted(unknown)[0]!r} for field {field!r}")
    return ops


def matches(get: Callable[[str], Any], filters: dict[str, Any]) -> bool:
    """Whether a row (read through ``get``) satisfies every field's every op."""
    for field, ops in filters.items():
        value = get(field)
        for op, wanted in check_ops(field, ops).items():
            if not compare(value, op, wanted):
                return False
    return True


def sort_rows(rows: list[dict], order: Iterable[tuple[str, str]]) -> list[dict]:
    """Rows sorted by several (field, asc|desc) keys; missing values last in both directions."""
    fields, signs = order_signs(order)

    def cmp(a: dict, b: dict) -> int:
        return compare_keys([a.get(f) for f in fields], [b.get(f) for f in fields], signs)

    return sorted(rows, key=functools.cmp_to_key(cmp))


def order_signs(order: Iterable[tuple[str, str]]) -> tuple[list[str], list[int]]:
    pairs = [(field, _direction(direction)) for field, direction in order]
    return [f for f, _ in pairs], [s for _, s in pairs]


def compare_keys(a: list, b: list, signs: list[int]) -> int:
    """-1, 0 or 1: ``a`` before, with or after ``b`` under per-key directions (+1 asc, -1 desc)."""
    for x, y, sign in zip(a, b, signs, strict=True):
        if x == y:
            continue
        if x is None or y is None:
            return 1 if x is None else -1
        try:
            return sign * (1 if x > y else -1)
        except TypeError:
            return sign * (1 if str(x) > str(y) else -1)
    return 0


def _direction(direction: str) -> int:
    if str(direction).lower() not in ("asc", "desc"):
        raise QueryError(f"order direction must be 'asc' or 'desc', not {direction!r}")
    return -1 if str(direction).lower() == "desc" else 1
