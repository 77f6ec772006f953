"""Interruptible (bid) instances: when a bid loses its machine and when it wins it back.

They live in the market of ``sandbox/bids.py``: a ``min_bid`` that walks, other tenants who
outbid at a rate falling with the margin, and the change-bid endpoint. ``outbid`` marks an
instance that lost its machine to a higher bid; ``outbid_resume`` whether it restarts once its
bid wins again (the renter has not stopped it meanwhile). The market decides when it moves;
this file decides what each move does to an instance.
"""

from __future__ import annotations

import math
from typing import Any

from sandbox import billing
from sandbox.engine.core import ACTIVE, BEFORE_RUNNING, EngineCore
from sandbox.engine.create_body import PRICE_MIN
from sandbox.errors import ApiError

# Change bid's own range, narrower than create's (vast-ai/docs api-reference/openapi.yaml,
# `put /api/v0/instances/bid_price/{id}/`: price minimum 0.001, maximum 32, 400 invalid_args).
BID_CHANGE_MAX = 32.0


class Outbids(EngineCore):
    """Bids: min_bid, change bid, losing and regaining the machine, the bid tick."""

    def min_bid_now(self, inst: dict, now: float) -> float:
        """What a bid on INST's machine must reach to win it now: the walk's ``min_bid``, or
        the bid of the tenant who outbid INST while that tenant holds the machine."""
        floor = self.bids.floor(inst["ask_id"], now)
        return max(floor, inst["rival_bid"] or 0.0)

    def change_bid(self, inst: dict, body: Any) -> dict:
        """``PUT /api/v0/instances/bid_price/{id}/`` ``{"client_id": "me", "price": x}``.

        Vast's spec (vast-ai/docs ``api-reference/openapi.yaml``) answers ``{"success": true}``,
        400 ``invalid_args`` ("Please set a bid price >= 0.001.") outside 0.001-32, and 404
        ``no_such_instance``. The CLI (vast-ai/vast-cli ``vast.py`` and
        ``vastai/cli/commands/instances.py``, ``change__bid``) sends ``price: null`` when none
        is given: "a winning bid price is used as the default", here the current ``min_bid``.
        What Vast answers for an on-demand instance is not documented: a 400 ``invalid_args``.
        A bid that reaches ``min_bid`` wins the machine back (the container starts again unless
        the renter stopped it); one lowered under it loses the machine at once.
        """
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_args", "body must be a JSON object")
        if not inst["is_bid"]:
            raise ApiError(
                400,
                "invalid_args",
                f"Instance {inst['id']} is on-demand, not interruptible: it has no bid to change.",
            )
        now = self.clock()
        with self.store.tx():
            inst = self.get(inst["id"])
            floor = self.min_bid_now(inst, now)
            price = _bid_price(body.get("price"), floor)
            old = inst["gpu_rate"]
            inst = self._update(
                inst["id"], now, event=f"bid changed ${old:g}/h -> ${price:g}/h", gpu_rate=price
            )
            if inst["outbid"] and price >= floor:
                self._regain(inst, now, "raised bid")
            elif not inst["outbid"] and inst["status"] in ACTIVE and price < floor:
                self._outbid(inst, now, "bid lowered under min_bid", "outbid: bid below min_bid")
        return {"success": True}

    def _record_outbid(self, inst: dict, now: float, cause: str, min_bid: float) -> None:
        self.store.run(
            "INSERT INTO outbids (instance_id, ts, cause, price, min_bid, running_h)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (inst["id"], now, cause, inst["gpu_rate"], min_bid, inst["bid_run_h"]),
        )

    def _outbid(self, inst: dict, now: float, cause: str, msg: str, **fields: Any) -> None:
        """A higher bid takes the machine: the container stops and Vast flips the intended
        state too (cur_state, intended_status and next_state all ``stopped``, as dstack sees
        it). It restarts when its bid wins again if it was heading for running."""
        with self.store.tx():
            inst = self._update(
                inst["id"],
                now,
                outbid=1,
                outbid_resume=int(inst["status"] in ACTIVE or bool(inst["outbid_resume"])),
                bid_clock=None,
                **fields,
            )
            self._record_outbid(inst, now, cause, self.min_bid_now(inst, now))
            if inst["status"] in BEFORE_RUNNING:
                # Outbid while its image loads: Vast gives the contract up where it stands,
                # actual_status still `loading` (or `created`) under the three stopped states
                # (a recorded instance body; a third-party Vast worker manager names it:
                # "container stopped during startup (e.g. outbid while pulling image)").
                # No container ran, so there is nothing to stop.
                event = f"outbid while {inst['status']}"
                self._update(
                    inst["id"], now, event, intended="stopped", deadline=None, status_msg=msg
                )
            else:
                self.stop(inst, msg=msg, intended="stopped")

    def _regain(self, inst: dict, now: float, why: str) -> None:
        """The bid is the highest again: the machine is ours, and the container starts (onstart
        again) unless the renter stopped it meanwhile or the account has no credit."""
        with self.store.tx():
            resume = bool(inst["outbid_resume"]) and inst["status"] in (
                "stopped",
                "exited",
                *BEFORE_RUNNING,
            )
            inst = self._update(
                inst["id"],
                now,
                event=f"bid has priority again ({why})",
                outbid=0,
                outbid_resume=0,
                rival_bid=None,
                rival_until=None,
                status_msg="" if inst["status_msg"].startswith("outbid") else inst["status_msg"],
            )
            if resume and billing.credit(self.store, inst["account_id"], now) > 0:
                self._update(inst["id"], now, intended="running")
                self._load(self.get(inst["id"]), now)

    def tick_bids(self) -> None:
        """The market moves: holders of outbid machines leave, min_bid walks past bids, and
        other tenants outbid running instances (``bids``: a Poisson process, rate λ(margin))."""
        now = self.clock()
        for r in self.store.rows(
            "SELECT id FROM instances WHERE destroyed_at IS NULL AND is_bid = 1"
        ):
            with self.store.tx():
                inst = self.get(r["id"])
                if inst is None or inst["destroyed_at"] is not None:
                    continue
                if inst["outbid"]:
                    self._tick_outbid(inst, now)
                elif inst["status"] in ACTIVE and inst["gpu_rate"] < self.min_bid_now(inst, now):
                    floor = self.min_bid_now(inst, now)
                    msg = f"outbid: min_bid rose to ${floor:g}/h, over the bid"
                    self._outbid(inst, now, "min_bid rose over the bid", msg)
                elif inst["status"] == "running" and inst["host_online"]:
                    self._accrue(inst, now)
                elif inst["bid_clock"] is not None:
                    self._update(inst["id"], now, bid_clock=None)

    def _tick_outbid(self, inst: dict, now: float) -> None:
        if inst["rival_until"] is not None and inst["rival_until"] <= now:
            inst = self._update(
                inst["id"], now, event="the higher bid ended", rival_bid=None, rival_until=None
            )
        if inst["gpu_rate"] >= self.min_bid_now(inst, now):
            self._regain(inst, now, "the machine is free again")

    def _accrue(self, inst: dict, now: float) -> None:
        """Integrate the outbid hazard λ(margin) over the sandbox hours since the last tick,
        exactly: min_bid is constant between the walk's steps, and the outbid happens where
        the integral reaches the instance's next unit-exponential draw."""
        if self.bids.settings.outbid_rate_per_h <= 0:
            return  # no other tenants: nothing to integrate
        t = inst["bid_clock"]
        if t is None or t > now:
            self._update(inst["id"], now, bid_clock=now)
            return
        bids, price = self.bids, inst["gpu_rate"]
        hazard, run_h = inst["bid_hazard"], inst["bid_run_h"]
        threshold = bids.threshold(inst["id"], inst["bid_draws"])
        while t < now:
            end = min(now, bids.next_change(t))
            floor = bids.floor(inst["ask_id"], (t + end) / 2)  # constant on [t, end)
            rate = bids.rate(price, floor)
            hours = (end - t) / bids.hour_s
            if rate > 0 and hazard + rate * hours >= threshold:
                needed = (threshold - hazard) / rate
                at = t + needed * bids.hour_s
                self._update(inst["id"], now, bid_run_h=run_h + needed)
                self._outbid_by_rival(self.get(inst["id"]), now, at, floor)
                return
            hazard, run_h, t = hazard + rate * hours, run_h + hours, end
        self._update(inst["id"], now, bid_clock=now, bid_hazard=hazard, bid_run_h=run_h)

    def _outbid_by_rival(self, inst: dict, now: float, at: float, floor: float) -> None:
        """Another tenant's bid arrived (at wall time AT, within the last tick): it takes the
        machine and keeps it for a seeded time; the next draw starts afresh."""
        draw, price = inst["bid_draws"], inst["gpu_rate"]
        rival = self.bids.rival_bid(inst["id"], draw, price, floor)
        hold = self.bids.hold_s(inst["id"], draw)
        self._outbid(
            inst,
            now,
            "a higher bid",
            f"outbid: a higher bid (${rival:g}/h) took the machine",
            rival_bid=rival,
            rival_until=None if hold is None else at + hold,
            bid_draws=draw + 1,
            bid_hazard=0.0,
        )


def _bid_price(value: Any, winning: float) -> float:
    """A change-bid price: None means the winning price (the CLI's "a winning bid price is used
    as the default"); otherwise a number in Vast's documented 0.001-32 range."""
    if value is None:
        return winning
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, "invalid_args", "Please set a bid price >= 0.001.")
    price = float(value)
    if not math.isfinite(price) or price < PRICE_MIN:
        raise ApiError(400, "invalid_args", "Please set a bid price >= 0.001.")
    if price > BID_CHANGE_MAX:
        raise ApiError(400, "invalid_args", f"Please set a bid price <= {BID_CHANGE_MAX:g}.")
    return price
