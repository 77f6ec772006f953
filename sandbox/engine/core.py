"""An instance row, its lookups, and ``_update``: the one place a row changes.

Stored ``status`` is one of created, loading, running, stopped, exited, rebooting. Two
flags change what is served without changing it: ``host_online = 0`` shows ``offline``
(Vast computes that status, it does not store it) and ``frozen`` (SIGSTOP, a network
partition) still shows ``running`` — from outside, a partitioned host looks alive to Vast.
A destroy sent to such an unreachable host ends the contract at once (gone from the lists,
nothing billed) but reaches the container only when the host is back: until then the row
keeps its ``pgid`` and the processes stay as they were, stopped.

Every change goes through ``_update``, which re-derives what is billed right now (GPU while
running on an online host; storage while the instance exists on an online host) and opens
or closes usage intervals to match. Billing therefore never drifts from the status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox import image_cache, weather
from sandbox.bids import BidMarket, BidSettings
from sandbox.engine import usage
from sandbox.market import Market
from sandbox.processes import Processes
from sandbox.state import Store, log_event
from sandbox.timing import Timing

ACTIVE = ("created", "loading", "running", "rebooting")  # statuses heading for / at running
BEFORE_RUNNING = ("created", "loading")  # the container has not run yet


class EngineCore:
    """What every part of the engine shares: the store (a change is one of its transactions),
    the market and its bids, the timing, the instances' processes, the lookups, and the write."""

    def __init__(
        self,
        store: Store,
        market: Market,
        timing: Timing,
        state_dir: Path,
        bill_image_pull: bool = True,
        clock: Callable[[], float] = time.time,
        bids: BidMarket | None = None,
        wipe_chance: float = image_cache.GUESSED_WIPE_CHANCE,
        market_weather: str = weather.NONE,
    ) -> None:
        self.store, self.market, self.timing, self.clock = store, market, timing, clock
        self.wipe_chance = wipe_chance  # a host wiped a machine's image between rentals
        self.weather = market_weather  # how rentals fail on their own (weather.py)
        self._traits: dict[int, weather.Traits] = {}  # by ask id (weather_fates.py)
        self.state_dir = state_dir
        self.bill_image_pull = bill_image_pull
        self.bids = bids or BidMarket(
            market.offers, BidSettings.off(), timing.seed, timing.hour_s, clock()
        )
        self.processes = Processes(self._on_exit)  # phases.py: a container that ended
        self.url = ""  # the server's base URL, known once it is bound
        self.stopping = False

    # ---- lookups -------------------------------------------------------------------------

    def get(self, instance_id: int) -> dict | None:
        return self.store.row("SELECT * FROM instances WHERE id = ?", (instance_id,))

    def owned(self, account_id: int, instance_id: int) -> dict | None:
        """A live instance of this account, or None (Vast answers null / 404 alike)."""
        inst = self.get(instance_id)
        if inst is None or inst["account_id"] != account_id or inst["destroyed_at"] is not None:
            return None
        return inst

    def rented_asks(self) -> set[int]:
        rows = self.store.rows("SELECT ask_id FROM instances WHERE destroyed_at IS NULL")
        return {r["ask_id"] for r in rows}

    def gone_asks(self) -> set[int]:
        """Asks off the market: for good (an injected ``destroy``), or until a host lost to
        the market weather is back (``back_at``)."""
        rows = self.store.rows(
            "SELECT ask_id FROM gone_asks WHERE back_at IS NULL OR back_at > ?", (self.clock(),)
        )
        return {r["ask_id"] for r in rows}

    def mark_gone(self, ask_id: int, now: float, back_at: float | None = None) -> None:
        """ASK_ID leaves the market, for good (BACK_AT None) or until BACK_AT; a later "for
        good" wins over a return that was due."""
        self.store.run(
            "INSERT INTO gone_asks (ask_id, at, back_at) VALUES (?, ?, ?)"
            " ON CONFLICT (ask_id) DO UPDATE SET at = excluded.at, back_at = excluded.back_at",
            (ask_id, now, back_at),
        )

    def scratch(self, instance_id: int) -> Path:
        return self.state_dir / "instances" / str(instance_id)

    # ---- the one place a row changes -----------------------------------------------------

    def _update(self, inst_id: int, now: float, event: str | None = None, **fields: Any) -> dict:
        """Write fields, log a status change, and make the open usage intervals match."""
        with self.store.tx():
            before = self.get(inst_id)
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                # Column names come from the engine's keyword arguments, never from a request.
                sql = f"UPDATE instances SET {sets} WHERE id = ?"  # noqa: S608
                self.store.run(sql, (*fields.values(), inst_id))
            inst = self.get(inst_id)
            if event or _shown(before) != _shown(inst):
                detail = "" if event else inst["status_msg"]
                log_event(self.store, inst_id, now, event or _shown(inst), detail)
            usage.sync_usage(self.store, inst, now)
            return inst

    def _release(self, inst_id: int, now: float, **fields: Any) -> tuple[dict, int | None]:
        """``_update`` that also takes the process group away from the instance, reading it
        inside the transaction: the ticker may have just started one."""
        with self.store.tx():
            pgid = self.get(inst_id)["pgid"]
            return self._update(inst_id, now, pgid=None, **fields), pgid

    def add_traffic(
        self, inst_id: int, direction: str, nbytes: int, now: float | None = None
    ) -> None:
        if nbytes > 0:
            usage.record_traffic(self.store, inst_id, direction, nbytes, now or self.clock())


def shown_status(inst: dict) -> str:
    """``actual_status`` as Vast serves it."""
    return "offline" if not inst["host_online"] else inst["status"]


def _shown(inst: dict | None) -> str | None:
    return shown_status(inst) if inst else None


def contract_end(inst: dict) -> float:
    """When INST's contract ends (``end_date``): created plus the offer's ``duration``; never
    for an offer that gives none (a hand-made market file)."""
    duration = float(json.loads(inst["offer"]).get("duration") or 0.0)
    return inst["created_at"] + duration if duration > 0 else float("inf")
