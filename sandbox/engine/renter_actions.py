"""What the renter's own requests do to an instance: destroy, stop, start, label and reboot
(``docs/vast-api.md`` §5). Change bid is ``outbids.py``.
"""

from __future__ import annotations

from typing import Any

from sandbox import billing, instance_python
from sandbox.engine.core import ACTIVE, EngineCore, contract_end
from sandbox.errors import ApiError
from sandbox.timing import REBOOT_S, STOP_GRACE_S

LABEL_MAX = 1024  # a label set later (PUT /instances/{id}/)


class RenterActions(EngineCore):
    """The renter's destroy, stop, start, label and reboot."""

    def destroy(self, inst: dict, by: str = "user") -> None:
        """Gone for good: processes killed, billing closed, the ask back on the market
        (or, when the host vanished, off it). A renter's destroy cannot reach a host that is
        cut off (frozen or offline): its processes are left stopped, with ``pgid`` kept, and
        killed once the host is back (``_deliver_queued_destroy``)."""
        now = self.clock()
        with self.store.tx():
            fields = {
                "event": f"destroyed by {by}",
                "destroyed_at": now,
                "destroyed_by": by,
                "deadline": None,
            }
            current = self.get(inst["id"])
            self._bill_cut_pull(current, now)  # the bytes a pull cut short got are billed
            if by == "user" and (current["frozen"] or not current["host_online"]):
                self._update(inst["id"], now, **fields)
                pgid = None
            else:
                _, pgid = self._release(inst["id"], now, **fields)
            if by == "host":
                self.mark_gone(inst["ask_id"], now)
        self.processes.kill(pgid)
        instance_python.discard(self.scratch(inst["id"]))  # a destroyed container's disk goes

    def stop(
        self, inst: dict, msg: str = "", intended: str = "stopped", renter: bool = False
    ) -> dict:
        """Stop the container; ``renter``: the renter asked, so an outbid instance will not
        restart on its own once its bid wins again."""
        extra = {"outbid_resume": 0} if renter else {}
        updated, pgid = self._release(
            inst["id"],
            self.clock(),
            status="stopped",
            intended=intended,
            deadline=None,
            frozen=0,
            status_msg=msg,
            bid_clock=None,
            **extra,
        )
        self.processes.kill(pgid, self.timing.phase(STOP_GRACE_S, inst["id"], "grace"))
        return updated

    def start(self, inst: dict) -> dict:
        """``state: running``: restart a stopped or exited container (onstart runs again)."""
        now = self.clock()
        if inst["status"] in ACTIVE and not inst["outbid"]:
            self._update(inst["id"], now, intended="running")
            return {"success": True}
        if inst["is_bid"] and not inst["outbid"] and inst["gpu_rate"] < self.min_bid_now(inst, now):
            self._outbid(inst, now, "min_bid above the bid at start", "outbid: bid below min_bid")
            inst = self.get(inst["id"])
        if inst["outbid"]:
            # Queued: it starts when its bid wins again (the docs: "paused until they become
            # the highest priority"), as a start on a busy machine waits (docs/vast-api.md §5).
            self._update(inst["id"], now, intended="running", outbid_resume=1)
            return {
                "success": False,
                "error": "resources_unavailable",
                "msg": "Required resources are currently unavailable; state change queued.",
            }
        if not inst["is_bid"] and contract_end(inst) <= now:
            raise ApiError(
                400, "invalid_args", "contract expired: an expired instance cannot start"
            )
        if billing.credit(self.store, inst["account_id"], now) <= 0:
            raise ApiError(
                400,
                "missing_billing",
                "Your account has no credit left; add credit to start instances.",
            )
        with self.store.tx():
            self._update(inst["id"], now, intended="running")
            self._load(self.get(inst["id"]), now)
        return {"success": True}

    def set_label(self, inst: dict, label: Any) -> None:
        if label is not None and not isinstance(label, str):
            raise ApiError(400, "invalid_args", "label must be a string")
        if label and len(label) > LABEL_MAX:
            raise ApiError(400, "invalid_args", f"label_too_long: at most {LABEL_MAX} characters")
        self._update(inst["id"], self.clock(), label=label)

    def reboot(self, inst: dict) -> None:
        """Container restart: processes killed, ``rebooting`` then ``loading``, onstart again."""
        if inst["status"] == "stopped":
            raise ApiError(400, "invalid_args", "instance is stopped; start it instead")
        now = self.clock()
        _, pgid = self._release(
            inst["id"],
            now,
            status="rebooting",
            intended="running",
            frozen=0,
            deadline=now + self.timing.phase(REBOOT_S, inst["id"], "reboot"),
        )
        self.processes.kill(pgid)
