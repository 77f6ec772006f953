"""Failure injection (``POST /sandbox/inject/{id}``, ``sandbox inject``): the dispatcher, and
the faults of one container or contract: a GPU fault, a slow machine, an outbid, a container
reboot, an early contract end, a container that cannot be created, an image pull that hangs,
an aged history, an overcharge. A host cut off, gone or rebooting is ``host_outages.py``.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox import gpu
from sandbox.engine.core import EngineCore
from sandbox.errors import ApiError

INSTANCE_ACTIONS = (
    "destroy",
    "freeze",
    "thaw",
    "offline",
    "online",
    "reboot-host",
    "gpu-fault",
    "slow",
    "outbid",
    "reboot",
    "overcharge",
    "age",
    "oci-fail",
    "expire-in",
    "stuck-loading",
)
# What a host whose NVIDIA runtime cannot attach the GPU shows, word for word from a recorded
# instance body (a public third-party Vast client's test fixture: actual_status `created`,
# cur_state, next_state and intended_status all `stopped`). dstack's Vast backend, compute.py,
# fails a `created` instance on ": OCI runtime create failed:".
OCI_FAILURE = (
    "Error response from daemon: failed to create task for container: failed to create shim "
    "task: OCI runtime create failed: could not apply required modification to OCI "
    "specification: error modifying OCI spec: failed to inject CDI devices: unresolvable CDI "
    "devices"
)

# A Docker pull's progress line, as Vast's status_msg carries one while an image loads (a
# recorded instance body shows "0d30c18b26f8: Retrying in 5 seconds"); this one never moves.
STUCK_PULL = "8f3a1c2d9e07: Downloading [=====>          ]  1.21GB/3.6GB"


class Faults(EngineCore):
    """``inject``, and the ``_inject_*`` handlers of one container or contract."""

    def inject(self, inst_id: int, action: str, arg: Any) -> dict:
        """One failure injection (``POST /sandbox/inject/{id}``)."""
        inst = self.get(inst_id)
        if inst is None or (
            inst["destroyed_at"] is not None and not _applies_after_destroy(inst, action)
        ):
            raise ApiError(404, "no_such_instance", f"no live instance {inst_id}")
        handler = getattr(self, "_inject_" + action.replace("-", "_"), None)
        if action not in INSTANCE_ACTIONS or handler is None:
            raise ApiError(
                400,
                "invalid_args",
                f"unknown action {action!r}; one of {', '.join(INSTANCE_ACTIONS)}",
            )
        handler(inst, arg)
        return self.debug_view(inst_id)

    def _inject_gpu_fault(self, inst: dict, arg: Any) -> None:
        offer = json.loads(inst["offer"])
        fault = gpu_fault_of(arg, int(offer.get("num_gpus", 1)))
        gpu.write_state(self.scratch(inst["id"]), inst["id"], offer, fault)
        self._update(
            inst["id"], self.clock(), event=f"gpu-fault {fault or 'cleared'}", gpu_fault=fault
        )

    def _inject_slow(self, inst: dict, arg: Any) -> None:
        factor = _positive(arg, "slow takes a factor > 0 (1.5 = 50% slower)")
        self._write_slow(inst["id"], factor)
        self._update(inst["id"], self.clock(), event=f"slow {factor}", slow=factor)

    def _inject_outbid(self, inst: dict, arg: Any) -> None:
        """Another tenant's higher bid takes the machine: the container stops and Vast flips
        the intended state too, so cur_state, intended_status and next_state all read
        ``stopped`` (dstack's Vast backend detects an interruption by exactly that). On an
        interruptible instance that tenant bids 1-25 % more and stays until ``end`` (its
        ``min_bid`` shows that bid; raising ours to it wins the machine back). ``end``: the
        tenant leaves and the container starts (onstart again) if the bid now wins. Works on
        on-demand instances too, for chaos tests (only ``end`` brings those back)."""
        now = self.clock()
        if arg in ("end", "resume"):
            if not inst["outbid"]:
                return
            if not inst["is_bid"] or inst["gpu_rate"] >= self.bids.floor(inst["ask_id"], now):
                self._regain(inst, now, "injected")
            else:  # the injected tenant left, but min_bid alone is over the bid
                self._update(inst["id"], now, rival_bid=None, rival_until=None)
            return
        if inst["outbid"]:
            return
        rival = {}
        if inst["is_bid"]:
            floor = self.bids.floor(inst["ask_id"], now)
            count = self.store.row(
                "SELECT COUNT(*) AS n FROM outbids WHERE instance_id = ?", (inst["id"],)
            )["n"]
            bid = self.bids.rival_bid(inst["id"], f"inject{count}", inst["gpu_rate"], floor)
            rival = {"rival_bid": bid, "rival_until": None}
        self._outbid(inst, now, "injected", "outbid: a higher bid took the machine", **rival)

    def _inject_reboot(self, inst: dict, arg: Any) -> None:
        self.reboot(inst)

    def _inject_expire_in(self, inst: dict, arg: Any) -> None:
        """Sandbox-only: the host's contract ends SECONDS from now (its ``end_date``), as if it
        had been listed with that little ``duration`` left; nothing else changes."""
        seconds = _positive(arg, "expire-in takes a number of seconds > 0")
        offer = json.loads(inst["offer"])
        offer["duration"] = self.clock() + seconds - inst["created_at"]
        event = f"contract ends in {seconds:g} s"
        self._update(inst["id"], self.clock(), event=event, offer=json.dumps(offer))

    def _inject_oci_fail(self, inst: dict, arg: Any) -> None:
        """The container cannot be created: Vast gives the contract up (cur_state,
        intended_status and next_state ``stopped``) but leaves ``actual_status`` at ``created``,
        the runtime's error in ``status_msg``, for good (no phase runs out any more), as the
        recorded body behind ``OCI_FAILURE`` shows. Storage still bills until it is destroyed."""
        _, pgid = self._release(
            inst["id"],
            self.clock(),
            status="created",
            intended="stopped",
            deadline=None,
            status_msg=OCI_FAILURE,
        )
        self.processes.kill(pgid)

    def _inject_stuck_loading(self, inst: dict, arg: Any) -> None:
        """The image pull hangs: the instance shows ``loading`` for good (no phase runs out any
        more), ``status_msg`` frozen on one line of a Docker pull (``STUCK_PULL``); a running
        container is taken back to ``loading`` first, its processes killed, as a restart whose
        pull never ends. Storage bills, the GPU does not (Vast's ``loading``). Vast's docs call
        a long ``loading`` normal "with slow internet/large images", so only the renter's start
        deadline can tell it from a slow pull."""
        if inst["status"] not in ("created", "loading", "running", "rebooting"):
            raise ApiError(400, "invalid_args", f"instance is {inst['status']}, not starting")
        _, pgid = self._release(
            inst["id"],
            self.clock(),
            event="image pull stuck",
            status="loading",
            frozen=0,
            deadline=None,
            status_msg=STUCK_PULL,
        )
        self.processes.kill(pgid)

    def _inject_age(self, inst: dict, arg: Any) -> None:
        """Move the contract's whole history SECONDS into the past (sandbox-only, for billing
        tests): created, usage, traffic and events happened that much earlier, and an open
        interval has been running since then. The way to get charges over several days."""
        seconds = _positive(arg, "age takes a number of seconds > 0")
        iid = inst["id"]
        with self.store.tx():
            self.store.run(
                "UPDATE instances SET created_at = created_at - ?,"
                " destroyed_at = destroyed_at - ? WHERE id = ?",
                (seconds, seconds, iid),
            )
            self.store.run(
                "UPDATE usage SET start = start - ?, stop = stop - ? WHERE instance_id = ?",
                (seconds, seconds, iid),
            )
            self.store.run("UPDATE traffic SET ts = ts - ? WHERE instance_id = ?", (seconds, iid))
            self.store.run("UPDATE events SET ts = ts - ? WHERE instance_id = ?", (seconds, iid))
            self._update(iid, self.clock(), event=f"aged {seconds:g} s")

    def _inject_overcharge(self, inst: dict, arg: Any) -> None:
        percent = _positive(arg, "overcharge takes a percentage > 0")
        self._update(inst["id"], self.clock(), event=f"overcharge {percent}%", overcharge=percent)


def _applies_after_destroy(inst: dict, action: str) -> bool:
    """Overcharge bills a contract after its end, age moves its history; thaw and online bring
    back a host that still holds a destroy queued for it."""
    return action in ("overcharge", "age") or (
        action in ("thaw", "online") and inst["pgid"] is not None
    )


def gpu_fault_of(arg: Any, num_gpus: int) -> str:
    """The ``gpu-fault`` injection's state: 'error' (no argument), 'hang', '' (clear) or
    'lost:N', GPU N of the instance's NUM_GPUS falling off the bus."""
    fault = {None: "error", "": "error", "error": "error", "hang": "hang", "clear": ""}.get(
        arg if isinstance(arg, str) or arg is None else "?"
    )
    if fault is not None:
        return fault
    index = str(arg).removeprefix("lost:")
    if str(arg).startswith("lost:") and index.isdigit() and int(index) < num_gpus:
        return f"lost:{int(index)}"
    raise ApiError(
        400,
        "invalid_args",
        f"gpu-fault takes no argument, 'hang', 'clear' or 'lost:N' (N a GPU index below "
        f"{num_gpus}, this instance's GPU count)",
    )


def _positive(value: Any, message: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", message) from exc
    if number <= 0:
        raise ApiError(400, "invalid_args", message)
    return number
