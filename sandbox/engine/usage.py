"""What an instance is billed for at each moment: usage intervals and traffic records.

Nothing is accrued in place: billing (``sandbox/billing.py``) integrates these records. Every
change of an instance row (``EngineCore._update``) ends in ``sync_usage``, which opens and closes
intervals to match ``billed_kinds``, so billing never drifts from the status.
"""

from __future__ import annotations

from sandbox.state import Store


def billed_kinds(inst: dict) -> set[str]:
    """What is billed at this moment: GPU while running, storage while the instance exists,
    neither while its host is offline (``docs/vast-api.md`` §7)."""
    if inst["destroyed_at"] is not None or not inst["host_online"]:
        return set()
    return {"gpu", "disk"} if inst["status"] == "running" else {"disk"}


def sync_usage(store: Store, inst: dict, now: float) -> None:
    """Open and close intervals to match ``billed_kinds``; a GPU interval whose rate is no
    longer the instance's (a changed bid) is closed and a new one opened at the new rate."""
    want = billed_kinds(inst)
    open_rows = store.rows(
        "SELECT id, kind, rate FROM usage WHERE instance_id = ? AND stop IS NULL",
        (inst["id"],),
    )
    kept = set()
    for r in open_rows:
        stale_rate = r["kind"] == "gpu" and r["rate"] not in (None, inst["gpu_rate"])
        if r["kind"] not in want or stale_rate:
            store.run("UPDATE usage SET stop = ? WHERE id = ?", (now, r["id"]))
        else:
            kept.add(r["kind"])
    for kind in want - kept:
        store.run(
            "INSERT INTO usage (instance_id, kind, start, rate) VALUES (?, ?, ?, ?)",
            (inst["id"], kind, now, inst["gpu_rate"] if kind == "gpu" else None),
        )


def record_traffic(store: Store, inst_id: int, direction: str, nbytes: int, now: float) -> None:
    """NBYTES more crossed the instance's metered link in DIRECTION (``down`` or ``up``) at NOW."""
    store.run(
        "INSERT INTO traffic (instance_id, ts, direction, bytes) VALUES (?, ?, ?, ?)",
        (inst_id, now, direction, int(nbytes)),
    )
