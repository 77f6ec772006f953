"""What ``GET /sandbox/instances/{id}`` shows (and every injection answers): an instance as
the tests and the CLI may want to see it, beyond Vast's fields: its processes, what it used and
billed, the bid market as it stands for it, the market weather's traits and fate, and its
events; and ``GET /sandbox/machines``, every machine's hidden traits.
"""

from __future__ import annotations

import json

from sandbox import billing
from sandbox.engine.core import EngineCore, shown_status
from sandbox.engine.usage import billed_kinds
from sandbox.processes import member_states


class DebugView(EngineCore):
    """The sandbox-only view of one instance."""

    def debug_view(self, inst_id: int) -> dict:
        """Everything the tests and the CLI may want to see, beyond Vast's fields."""
        inst = self.get(inst_id)
        now = self.clock()
        usage = billing.window_usage(self.store, inst_id, float("-inf"), now, now)
        costs = billing.item_costs(inst, usage)
        events = self.store.rows(
            "SELECT ts, kind, detail FROM events WHERE instance_id = ? ORDER BY id", (inst_id,)
        )
        return {
            "id": inst_id,
            "account_id": inst["account_id"],
            "ask_id": inst["ask_id"],
            "status": inst["status"],
            "actual_status": shown_status(inst),
            "intended": inst["intended"],
            "destroyed_by": inst["destroyed_by"],
            "pgid": inst["pgid"],
            "processes": _process_states(inst["pgid"]),
            "destroy_queued": inst["destroyed_at"] is not None and inst["pgid"] is not None,
            "runs": inst["runs"],
            "frozen": bool(inst["frozen"]),
            "host_online": bool(inst["host_online"]),
            "host_returns_at": inst["returns_at"],  # a rebooted host's return (None: never)
            "outbid": bool(inst["outbid"]),
            "bid": self._bid_view(inst, now),
            "gpu_fault": inst["gpu_fault"],
            "slow": inst["slow"],
            "overcharge": inst["overcharge"],
            "scratch": str(self.scratch(inst_id)),
            "image_bytes": inst["image_bytes"],
            # Sandbox-only: pulled, found on the machine from an earlier rental, or wiped.
            "image_source": inst["image_source"],
            # Sandbox-only: which registry login the create carried (registry and user, no token).
            "image_login": json.loads(inst["config"]).get("image_login"),
            "billing_now": sorted(billed_kinds(inst)),
            "rates": {
                "gpu_per_hour": inst["gpu_rate"],
                "disk_per_hour": inst["disk_rate"],
                "down_per_gb": inst["down_rate"],
                "up_per_gb": inst["up_rate"],
            },
            "usage": {
                "gpu_s": usage.gpu_s,
                "disk_s": usage.disk_s,
                "down_bytes": usage.down,
                "up_bytes": usage.up,
            },
            "billed": {k: amount for k, (_, amount, _) in costs.items()},
            "events": events,
            # Sandbox-only: the market weather's traits of the machine and this rental's fate.
            "weather": self.weather_view(inst, now),
        }

    def _bid_view(self, inst: dict, now: float) -> dict | None:
        """The interruptible market as it stands for INST (None for on-demand)."""
        if not inst["is_bid"]:
            return None
        floor = self.bids.floor(inst["ask_id"], now)
        outbids = self.store.rows(
            "SELECT ts, cause, price, min_bid, running_h FROM outbids WHERE instance_id = ?"
            " ORDER BY id",
            (inst["id"],),
        )
        return {
            "price": inst["gpu_rate"],
            "min_bid": self.min_bid_now(inst, now),
            "walk_min_bid": floor,
            "outbid_rate_per_h": self.bids.rate(inst["gpu_rate"], floor),
            "rival_bid": inst["rival_bid"],
            "rival_until": inst["rival_until"],
            "resume_when_priority_returns": bool(inst["outbid_resume"]),
            "running_h": inst["bid_run_h"],
            "hazard": inst["bid_hazard"],
            "next_outbid_at_hazard": self.bids.threshold(inst["id"], inst["bid_draws"]),
            "outbids": outbids,
        }

    def weather_view(self, inst: dict, now: float) -> dict | None:
        """``GET /sandbox/instances/{id}``'s ``weather``: the machine's traits, the rental's
        fate, the hours of loading and downloading it has had, what comes due and when."""
        fate = self.fate_of(inst)
        if fate is None:
            return None
        return {
            "weather": self.weather,
            "traits": self.traits(inst["ask_id"]).as_dict(),
            "fate": fate.as_dict(),
            "load_exposure_h": inst["load_exposure_s"] / 3600,
            "pull_progress": self.pull_progress(inst, now) if inst["status"] == "loading" else None,
            "next": inst["fate_what"] or None,
            "at": inst["fate_at"],
        }

    def machines_view(self) -> dict:
        """``GET /sandbox/machines``: every machine's hidden traits in this weather."""
        machines = []
        for ask_id, offer in sorted(self.market.offers.items()):
            machines.append(
                {
                    "ask_id": ask_id,
                    "gpu_name": offer.get("gpu_name"),
                    "reliability2": offer.get("reliability2", offer.get("reliability")),
                    "hosting_type": offer.get("hosting_type"),
                    "inet_down": offer.get("inet_down"),
                    **self.traits(ask_id).as_dict(),
                }
            )
        return {"weather": self.weather, "seed": self.timing.seed, "machines": machines}


def _process_states(pgid: int | None) -> list[dict]:
    if not pgid:
        return []
    return [{"pid": pid, "state": state} for pid, state in sorted(member_states(pgid).items())]
