"""Instance lifecycle: rent, the phases Vast shows, user actions and injected failures.

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

Interruptible (bid) instances also live in the market of ``bids``: a ``min_bid`` that walks,
other tenants who outbid at a rate falling with the margin, and the change-bid endpoint.
``outbid`` marks an instance that lost its machine to a higher bid; ``outbid_resume`` whether
it restarts once its bid wins again (the renter has not stopped it meanwhile).
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import shlex
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox import billing, gpu, image_cache
from sandbox.bids import BidMarket, BidSettings
from sandbox.market import HOURS_PER_MONTH, Market, public
from sandbox.processes import (
    Processes,
    group_alive,
    group_belongs,
    instance_env,
    member_states,
    signal_group,
)
from sandbox.state import Store, log_event
from sandbox.timing import (
    CONTAINER_START_S,
    DESTROY_DELIVERY_S,
    REBOOT_S,
    STOP_GRACE_S,
    Timing,
)

LABEL_MAX = 1024  # a label set later (PUT /instances/{id}/)
# Create's own limits (vast-ai/docs create_instance.yaml): label at most 256 characters,
# onstart + args (+ args_str) at most 4,096 together, disk at least 8 GB.
CREATE_LABEL_MAX = 256
CREATE_SCRIPT_MAX = 4096
DISK_MIN_GB = 8.0
PRICE_MIN, PRICE_MAX = 0.001, 128.0
# Change bid's own range, narrower than create's (vast-ai/docs api-reference/openapi.yaml,
# `put /api/v0/instances/bid_price/{id}/`: price minimum 0.001, maximum 32, 400 invalid_args).
BID_CHANGE_MAX = 32.0
DEFAULT_DISK_GB = 10.0  # the SDK's default; the docs say 8
ACTIVE = ("created", "loading", "running", "rebooting")  # statuses heading for / at running
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
BEFORE_RUNNING = ("created", "loading")  # the container has not run yet


class ApiError(Exception):
    """An error answered in Vast's shape: ``{"success": false, "error": ..., "msg": ...}``."""

    def __init__(self, status: int, error: str, msg: str, **extra: Any) -> None:
        super().__init__(msg)
        self.status, self.error, self.msg, self.extra = status, error, msg, extra

    def body(self) -> dict[str, Any]:
        return {"success": False, "error": self.error, "msg": self.msg, **self.extra}


class Engine:
    """All instance state transitions. Thread-safe: each one is a store transaction."""

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
    ) -> None:
        self.store, self.market, self.timing, self.clock = store, market, timing, clock
        self.wipe_chance = wipe_chance  # a host wiped a machine's image between rentals
        self.state_dir = state_dir
        self.bill_image_pull = bill_image_pull
        self.bids = bids or BidMarket(
            market.offers, BidSettings.off(), timing.seed, timing.hour_s, clock()
        )
        self.processes = Processes(self._on_exit)
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
        return {r["ask_id"] for r in self.store.rows("SELECT ask_id FROM gone_asks")}

    def refuse_ask(self, ask_id: int) -> None:
        """Sandbox-only (``inject refuse-ask ASK_ID``): from now on a create of ASK_ID is
        refused with the 403 Vast documents for an offer the renter may not rent; the ask stays
        listed. Any other refusal of that one offer reads the same to a renter."""
        if self.market.get(ask_id) is None:
            raise ApiError(404, "no_such_ask", f"no ask {ask_id} in the market", ask_id=ask_id)
        self.store.run(
            "INSERT OR IGNORE INTO refused_asks (ask_id, at) VALUES (?, ?)", (ask_id, self.clock())
        )

    def scratch(self, instance_id: int) -> Path:
        return self.state_dir / "instances" / str(instance_id)

    # ---- create --------------------------------------------------------------------------

    def create(self, account_id: int, ask_id: int, body: dict) -> dict:
        """``PUT /asks/{id}/``: rent an ask. Exactly one of concurrent renters wins."""
        config = _config(body)
        now = self.clock()
        with self.store.tx():
            offer = self._available_offer(ask_id)
            if config["disk"] > float(offer.get("disk_space", 0)):
                raise ApiError(
                    400,
                    "invalid_args",
                    f"disk {config['disk']} GB exceeds the offer's {offer['disk_space']} GB",
                )
            if billing.credit(self.store, account_id, now) <= 0:
                # Vast's generated spec: create answers 400 invalid_args "for billing issues".
                raise ApiError(
                    400,
                    "invalid_args",
                    "Your account has a billing issue: no credit left. Add credit to rent.",
                )
            inst_id = self._insert(account_id, ask_id, offer, config, now)
            self._prepare_scratch(inst_id, offer, config)
            inst = self._initial_status(inst_id, offer, config, now)
        return {
            "success": inst["status"] != "stopped" or inst["intended"] != "stopped",
            "new_contract": inst_id,
            "instance_api_key": inst["api_key"],
        }

    def _available_offer(self, ask_id: int) -> dict:
        """The offer behind ASK_ID, or the 404 Vast gives for a gone one. Its two sources
        disagree on the code, so both are served: an ask that was never there or left the
        market answers `no_such_ask` (the generated spec), one rented meanwhile `invalid_args`
        with "no_such_ask" in the message (the hand-written create_instance example)."""
        offer = self.market.get(ask_id)
        text = f"error 404/3603: no_such_ask  Instance type by id {ask_id} is not available."
        if offer is None or ask_id in self.gone_asks():
            raise ApiError(404, "no_such_ask", text, ask_id=ask_id)
        if ask_id in self.rented_asks() or ask_id in self.market.taken_by_others:
            raise ApiError(404, "invalid_args", text, ask_id=ask_id)
        if self.store.row("SELECT 1 AS x FROM refused_asks WHERE ask_id = ?", (ask_id,)):
            # The hand-written create_instance.yaml's 403, word for word: a host-only account
            # renting another host's offer. A refusal of this one offer, not of the key.
            refused = (
                f"error 403/3586: Offer {ask_id} is not your own. "
                "Hosts can only rent their own machines."
            )
            raise ApiError(403, "invalid_args", refused, ask_id=ask_id)
        return offer

    def _insert(self, account_id: int, ask_id: int, offer: dict, config: dict, now: float) -> int:
        is_bid = config["price"] is not None
        gpu_rate = float(config["price"] if is_bid else offer["dph_base"])
        disk_rate = float(offer.get("storage_cost", 0.0)) * config["disk"] / HOURS_PER_MONTH
        return self.store.run(
            "INSERT INTO instances (account_id, ask_id, offer, config, api_key, label, created_at,"
            " status, intended, is_bid, gpu_rate, disk_rate, down_rate, up_rate, image_bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'created', 'running', ?, ?, ?, ?, ?, ?)",
            (
                account_id,
                ask_id,
                json.dumps(public(offer)),
                json.dumps(config),
                secrets.token_hex(32),
                config["label"],
                now,
                int(is_bid),
                gpu_rate,
                disk_rate,
                float(offer.get("inet_down_cost", 0.0)),
                float(offer.get("inet_up_cost", 0.0)),
                self.timing.image_bytes(config["image"]),
            ),
        )

    def _initial_status(self, inst_id: int, offer: dict, config: dict, now: float) -> dict:
        log_event(self.store, inst_id, now, "created", f"ask {offer['id']}")
        if config["target_state"] == "stopped":
            return self._update(inst_id, now, status="stopped", intended="stopped")
        floor = self.bids.floor(int(offer["id"]), now)
        if config["price"] is not None and config["price"] < floor:
            # A bid under the floor is created stopped, like an outbid one, and the create
            # answers success: false with its new_contract (Vast's generated create spec:
            # "false if it started in stopped state"; dstack's api_client.py relies on it).
            # It starts once its bid wins: a raised bid, or a min_bid that falls below it.
            self._record_outbid(self.get(inst_id), now, "below min_bid at create", floor)
            return self._update(
                inst_id,
                now,
                status="stopped",
                intended="stopped",
                outbid=1,
                outbid_resume=1,
                status_msg="outbid: bid below min_bid",
            )
        deadline = now + self.timing.scheduling_s(inst_id)
        return self._update(inst_id, now, status="created", deadline=deadline)

    def _prepare_scratch(self, inst_id: int, offer: dict, config: dict) -> None:
        scratch = self.scratch(inst_id)
        scratch.mkdir(parents=True, exist_ok=True)
        gpu.install(scratch, inst_id, offer)
        (scratch / "onstart.sh").write_text(_script(config))
        self._write_slow(inst_id, 1.0)

    def _write_slow(self, inst_id: int, injected: float) -> None:
        inst = self.get(inst_id)
        factor = injected * self.market.speed_factor(inst["ask_id"]) if inst else injected
        (self.scratch(inst_id) / "slow").write_text(f"{factor:.4f}\n")

    # ---- the one place a row changes -----------------------------------------------------

    def _update(self, inst_id: int, now: float, event: str | None = None, **fields: Any) -> dict:
        """Write fields, log a status change, and make the open usage intervals match."""
        with self.store.tx():
            before = self.get(inst_id)
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                # Column names come from this module's keyword arguments, never from a request.
                sql = f"UPDATE instances SET {sets} WHERE id = ?"  # noqa: S608
                self.store.run(sql, (*fields.values(), inst_id))
            inst = self.get(inst_id)
            if event or _shown(before) != _shown(inst):
                detail = "" if event else inst["status_msg"]
                log_event(self.store, inst_id, now, event or _shown(inst), detail)
            self._sync_usage(inst, now)
            return inst

    def _sync_usage(self, inst: dict, now: float) -> None:
        """Open and close intervals to match ``billed_kinds``; a GPU interval whose rate is no
        longer the instance's (a changed bid) is closed and a new one opened at the new rate."""
        want = billed_kinds(inst)
        open_rows = self.store.rows(
            "SELECT id, kind, rate FROM usage WHERE instance_id = ? AND stop IS NULL",
            (inst["id"],),
        )
        kept = set()
        for r in open_rows:
            stale_rate = r["kind"] == "gpu" and r["rate"] not in (None, inst["gpu_rate"])
            if r["kind"] not in want or stale_rate:
                self.store.run("UPDATE usage SET stop = ? WHERE id = ?", (now, r["id"]))
            else:
                kept.add(r["kind"])
        for kind in want - kept:
            self.store.run(
                "INSERT INTO usage (instance_id, kind, start, rate) VALUES (?, ?, ?, ?)",
                (inst["id"], kind, now, inst["gpu_rate"] if kind == "gpu" else None),
            )

    # ---- phases --------------------------------------------------------------------------

    def tick(self) -> None:
        """Advance every instance whose current phase has run out."""
        now = self.clock()
        self._return_hosts(now)
        due = self.store.rows(
            "SELECT id FROM instances WHERE destroyed_at IS NULL AND host_online = 1"
            " AND deadline IS NOT NULL AND deadline <= ?",
            (now,),
        )
        for r in due:
            self._advance(r["id"], now)

    def _advance(self, inst_id: int, now: float) -> None:
        with self.store.tx():
            inst = self.get(inst_id)
            if (
                inst is None
                or inst["destroyed_at"] is not None
                or not inst["deadline"]
                or inst["deadline"] > now
            ):
                return
            if inst["status"] in ("created", "rebooting"):
                self._load(inst, now)
            elif inst["status"] == "loading":
                self._finish_pull(inst, now)
                self._run(inst, now)

    def _load(self, inst: dict, now: float) -> dict:
        """Enter ``loading``: pull the image, or just start the container when the instance
        (a reboot, a restart) or its machine (an earlier rental's pull) already has it."""
        offer = json.loads(inst["offer"])
        if not inst["image_cached"]:
            inst = self._look_for_image_on_machine(inst, now)
        if inst["image_cached"]:
            seconds = self.timing.phase(CONTAINER_START_S, inst["id"], "start")
        else:
            seconds = self.timing.pull_s(
                inst["image_bytes"], float(offer.get("inet_down", 100.0)), inst["id"]
            )
        return self._update(
            inst["id"], now, status="loading", deadline=now + seconds, status_msg=""
        )

    def _look_for_image_on_machine(self, inst: dict, now: float) -> dict:
        """A new instance on a machine that pulled its image for an earlier rental finds it
        there, unless the host wiped it meanwhile (one seeded draw: ``image_cache``)."""
        if inst["image_source"]:
            return inst  # drawn already (a load stopped by an outbid starts again)
        machine, image = image_cache.machine_of(inst), json.loads(inst["config"])["image"]
        if not image_cache.holds(self.store, machine, image, before=inst["created_at"]):
            return self._update(inst["id"], now, image_source="pulled")
        if image_cache.wiped_between_rentals(self.timing.seed, inst["id"], self.wipe_chance):
            image_cache.forget(self.store, machine, image)
            return self._update(
                inst["id"], now, event="image wiped from the machine", image_source="wiped"
            )
        return self._update(
            inst["id"],
            now,
            event="image cached on the machine",
            image_source="machine",
            image_cached=1,
        )

    def _finish_pull(self, inst: dict, now: float) -> None:
        if inst["image_cached"]:
            return
        self.store.run("UPDATE instances SET image_cached = 1 WHERE id = ?", (inst["id"],))
        image = json.loads(inst["config"])["image"]
        image_cache.remember_pull(self.store, image_cache.machine_of(inst), image, now)
        if self.bill_image_pull:  # the pull crosses the host's metered link like any download
            self.add_traffic(inst["id"], "down", inst["image_bytes"], now)

    def _run(self, inst: dict, now: float) -> dict:
        """Enter ``running`` and start the onstart script (if there is one)."""
        config = json.loads(inst["config"])
        pgid = None
        if _script(config).strip():
            pgid = self.processes.start(
                inst["id"], self.scratch(inst["id"]), self._env(inst, config)
            )
        return self._update(
            inst["id"],
            now,
            status="running",
            deadline=None,
            pgid=pgid,
            frozen=0,
            runs=inst["runs"] + 1,
            status_msg="",
            bid_clock=now if inst["is_bid"] else None,
        )

    def _env(self, inst: dict, config: dict) -> dict[str, str]:
        host_port = self.url.split("//", 1)[-1]
        return instance_env(
            instance_id=inst["id"],
            api_key=inst["api_key"],
            user_env=config["env"],
            scratch=self.scratch(inst["id"]),
            sandbox_url=self.url,
            proxy_url=f"http://i{inst['id']}:{inst['api_key']}@{host_port}",
        )

    def _on_exit(self, inst_id: int, pgid: int, code: int | None) -> None:
        """The container's last process ended on its own: Vast shows ``exited``."""
        if self.stopping:
            return
        with self.store.tx():
            inst = self.get(inst_id)
            if inst is None or inst["pgid"] != pgid:
                return  # we stopped it on purpose (pgid was cleared first)
            if inst["destroyed_at"] is not None:  # before the queued destroy arrived
                self._update(inst_id, self.clock(), event="container ended", pgid=None)
                return
            msg = (
                f"onstart exited with code {code}"
                if code is not None
                else "container processes ended"
            )
            if keeps_container_up(json.loads(inst["config"])["runtype"]):
                # Vast's ssh/jupyter entrypoint is the container's main process, not onstart:
                # the container stays `running` (GPU billed) after onstart or the agent ends,
                # and only the renter's heartbeat can tell (vast-ai/docs show_instance status
                # table).
                self._update(inst_id, self.clock(), event=msg, pgid=None)
                return
            self._update(
                inst_id, self.clock(), status="exited", pgid=None, deadline=None, status_msg=msg
            )

    # ---- user actions --------------------------------------------------------------------

    def _release(self, inst_id: int, now: float, **fields: Any) -> tuple[dict, int | None]:
        """``_update`` that also takes the process group away from the instance, reading it
        inside the transaction: the ticker may have just started one."""
        with self.store.tx():
            pgid = self.get(inst_id)["pgid"]
            return self._update(inst_id, now, pgid=None, **fields), pgid

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
            if by == "user" and (current["frozen"] or not current["host_online"]):
                self._update(inst["id"], now, **fields)
                pgid = None
            else:
                _, pgid = self._release(inst["id"], now, **fields)
            if by == "host":
                self.store.run(
                    "INSERT OR IGNORE INTO gone_asks (ask_id, at) VALUES (?, ?)",
                    (inst["ask_id"], now),
                )
        self.processes.kill(pgid)

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

    # ---- the interruptible market (bids.py) ------------------------------------------------

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

    # ---- injections ----------------------------------------------------------------------

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

    def _inject_destroy(self, inst: dict, arg: Any) -> None:
        """The host vanished (powered off for good, pulled from the market). A host cannot
        delete a renter's instance (Vast's jsbcannell in cloud-gpus.github.io PR #13; the
        status table's ``offline``): it stays listed as ``offline``, billing nothing (Vast's
        billing guide: no GPU or storage charge while offline), until the renter destroys it.
        Its processes die with the machine; its ask never comes back."""
        now = self.clock()
        with self.store.tx():
            _, pgid = self._release(
                inst["id"],
                now,
                event="host vanished",
                host_online=0,
                deadline=None,
                status_msg="host unreachable",
            )
            self.store.run(
                "INSERT OR IGNORE INTO gone_asks (ask_id, at) VALUES (?, ?)", (inst["ask_id"], now)
            )
        self.processes.kill(pgid)

    def _inject_freeze(self, inst: dict, arg: Any) -> None:
        signal_group(inst["pgid"], signal.SIGSTOP)
        self._update(inst["id"], self.clock(), event="frozen", frozen=1)

    def _inject_thaw(self, inst: dict, arg: Any) -> None:
        delay = _delivery_delay(arg)
        if inst["host_online"]:
            signal_group(inst["pgid"], signal.SIGCONT)
        self._deliver_queued_destroy(
            self._update(inst["id"], self.clock(), event="thawed", frozen=0), delay
        )

    def _inject_offline(self, inst: dict, arg: Any) -> None:
        signal_group(inst["pgid"], signal.SIGSTOP)  # the host is cut off: nothing gets in or out
        self._update(inst["id"], self.clock(), host_online=0)

    def _inject_online(self, inst: dict, arg: Any) -> None:
        delay = _delivery_delay(arg)
        if not inst["frozen"]:
            signal_group(inst["pgid"], signal.SIGCONT)
        self._deliver_queued_destroy(self._update(inst["id"], self.clock(), host_online=1), delay)

    def _deliver_queued_destroy(self, inst: dict, delay_s: float | None) -> None:
        """The host is reachable again: the destroy queued for it arrives once its daemon
        has checked in, and until then its processes run and may still make calls."""
        if inst["destroyed_at"] is None or not inst["pgid"]:
            return
        if inst["frozen"] or not inst["host_online"]:
            return
        if delay_s is None:
            delay_s = self.timing.phase(DESTROY_DELIVERY_S, inst["id"], "destroy delivery")
        timer = threading.Timer(delay_s, self._remove_container, args=(inst["id"], inst["pgid"]))
        timer.daemon = True
        timer.start()

    def _remove_container(self, inst_id: int, pgid: int) -> None:
        if self.stopping:
            return
        with self.store.tx():
            if self.get(inst_id)["pgid"] != pgid:
                return  # the container ended on its own first
            self._update(inst_id, self.clock(), event="queued destroy delivered", pgid=None)
        self.processes.kill(pgid)

    def _inject_reboot_host(self, inst: dict, arg: Any) -> None:
        """The host reboots: every process dies, the host daemon is disconnected and Vast
        shows the instance ``offline`` (computed while the host is away; no GPU or storage
        billed, ``docs/vast-api.md`` §7). The instance is not deleted: a host cannot delete a
        renter's instance (Vast's jsbcannell in cloud-gpus.github.io PR #13), and Vast's
        ``instance_online`` webhook (vast-ai/docs, webhooks) is the host coming back. ARG: the
        wall seconds until it does, ``never``, or nothing for a seeded draw
        (``Timing.host_return_s``; some hosts never return). Back, the container restarts on
        the same disk (``_return_hosts``)."""
        now = self.clock()
        spell = inst["host_spells"] + 1
        if arg in (None, ""):
            back_in = self.timing.host_return_s(inst["id"], spell)
        elif arg == "never":
            back_in = None
        else:
            back_in = _non_negative(arg, "reboot-host takes SECONDS, never, or nothing")
        _, pgid = self._release(
            inst["id"],
            now,
            event="host rebooting" + ("" if back_in is None else f", back in {back_in:.1f} s"),
            host_online=0,
            status="rebooting",
            deadline=None,
            returns_at=None if back_in is None else now + back_in,
            host_spells=spell,
            status_msg="host offline (rebooting)",
        )
        self.processes.kill(pgid)

    def _return_hosts(self, now: float) -> None:
        """Rebooted hosts whose return time came reconnect. Their instances go through
        ``rebooting`` → ``loading`` → ``running`` again with their disk as it was (the image is
        cached, so loading is only a container start, and the scratch folder is untouched):
        the onstart script runs again, as in ``reboot`` (a container restart). Vast's docs
        ("Instance details": a stopped instance's "data on the machine is still accessible")
        say the disk outlives the container; that onstart runs again on the host's return is
        this model's assumption, as for a reboot, not a published fact."""
        due = self.store.rows(
            "SELECT id FROM instances WHERE destroyed_at IS NULL AND host_online = 0"
            " AND returns_at IS NOT NULL AND returns_at <= ?",
            (now,),
        )
        for r in due:
            self._update(
                r["id"],
                now,
                event="host back online",
                host_online=1,
                returns_at=None,
                status="rebooting",
                status_msg="",
                deadline=now + self.timing.phase(REBOOT_S, r["id"], "reboot"),
            )

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

    # ---- traffic, credit, restart ----------------------------------------------------------

    def add_traffic(
        self, inst_id: int, direction: str, nbytes: int, now: float | None = None
    ) -> None:
        if nbytes > 0:
            self.store.run(
                "INSERT INTO traffic (instance_id, ts, direction, bytes) VALUES (?, ?, ?, ?)",
                (inst_id, now or self.clock(), direction, int(nbytes)),
            )

    def enforce_expiry(self) -> None:
        """An on-demand contract whose ``end_date`` passed is stopped, for good: Vast stops an
        expired instance and will not restart it (its guide "Choosing an instance type",
        "Maximum duration"; ``docs/vast-api.md`` §7)."""
        now = self.clock()
        for inst in self.store.rows(
            "SELECT * FROM instances WHERE destroyed_at IS NULL AND is_bid = 0"
            " AND status IN ('created', 'loading', 'running', 'rebooting')"
        ):
            if contract_end(inst) <= now:
                self.stop(inst, msg="stopped: contract expired (end_date passed)")

    def enforce_credit(self) -> None:
        """An account at zero credit has its instances stopped (storage keeps billing)."""
        now = self.clock()
        active = self.store.rows(
            "SELECT * FROM instances WHERE destroyed_at IS NULL"
            " AND status IN ('created', 'loading', 'running', 'rebooting')"
        )
        broke: dict[int, bool] = {}
        for inst in active:
            account = inst["account_id"]
            if account not in broke:
                broke[account] = billing.credit(self.store, account, now) <= 0
            if broke[account]:
                self.stop(inst, msg="stopped: account credit exhausted")

    def recover(self) -> None:
        """After a sandbox restart: adopt surviving process groups, reboot the rest.

        A group that is still alive (the sandbox was killed, its "hosts" were not) keeps
        running and billing. Otherwise the host went down with the sandbox: its usage stops
        at the last moment the sandbox was alive, and a running instance comes back the way a
        rebooted Vast host's does — rebooting, loading, onstart again.
        """
        now = self.clock()
        last_alive = min(float(self.store.meta("alive") or now), now)
        self._deliver_destroys_left_queued(now)
        for inst in self.store.rows("SELECT * FROM instances WHERE destroyed_at IS NULL"):
            pgid = inst["pgid"]
            if pgid and group_alive(pgid) and group_belongs(pgid, inst["id"]):
                self.processes.adopt(inst["id"], pgid)
                continue
            with self.store.tx():
                self.store.run(
                    "UPDATE usage SET stop = ? WHERE instance_id = ? AND stop IS NULL",
                    (last_alive, inst["id"]),
                )
                if inst["status"] == "running":
                    self._update(
                        inst["id"],
                        now,
                        event="host restarted",
                        status="rebooting",
                        pgid=None,
                        frozen=0,
                        deadline=now + self.timing.phase(REBOOT_S, inst["id"], "reboot"),
                    )
                else:
                    self._update(inst["id"], now, pgid=None)

    def _deliver_destroys_left_queued(self, now: float) -> None:
        """A destroyed instance whose processes outlived a sandbox crash is removed now."""
        queued = self.store.rows(
            "SELECT * FROM instances WHERE destroyed_at IS NOT NULL AND pgid IS NOT NULL"
        )
        for inst in queued:
            pgid = inst["pgid"]
            self._update(inst["id"], now, event="queued destroy delivered", pgid=None)
            if group_alive(pgid) and group_belongs(pgid, inst["id"]):
                self.processes.adopt(inst["id"], pgid)
                self.processes.kill(pgid)

    def shutdown(self) -> None:
        """The sandbox stops: every "host" powers off with it."""
        self.stopping = True
        self.store.set_meta("alive", repr(self.clock()))
        self.processes.kill_all()

    # ---- introspection (sandbox-only endpoints) --------------------------------------------

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


def _applies_after_destroy(inst: dict, action: str) -> bool:
    """Overcharge bills a contract after its end, age moves its history; thaw and online bring
    back a host that still holds a destroy queued for it."""
    return action in ("overcharge", "age") or (
        action in ("thaw", "online") and inst["pgid"] is not None
    )


def _delivery_delay(arg: Any) -> float | None:
    if arg in (None, ""):
        return None
    try:
        seconds = float(arg)
    except (TypeError, ValueError) as exc:
        raise ApiError(
            400, "invalid_args", "takes the seconds a queued destroy needs to arrive"
        ) from exc
    if seconds < 0:
        raise ApiError(400, "invalid_args", "the delay of a queued destroy cannot be negative")
    return seconds


def _process_states(pgid: int | None) -> list[dict]:
    if not pgid:
        return []
    return [{"pid": pid, "state": state} for pid, state in sorted(member_states(pgid).items())]


def shown_status(inst: dict) -> str:
    """``actual_status`` as Vast serves it."""
    return "offline" if not inst["host_online"] else inst["status"]


def _shown(inst: dict | None) -> str | None:
    return shown_status(inst) if inst else None


def billed_kinds(inst: dict) -> set[str]:
    """What is billed at this moment: GPU while running, storage while the instance exists,
    neither while its host is offline (``docs/vast-api.md`` §7)."""
    if inst["destroyed_at"] is not None or not inst["host_online"]:
        return set()
    return {"gpu", "disk"} if inst["status"] == "running" else {"disk"}


def _config(body: dict) -> dict:
    """The create body, validated and normalised (``docs/vast-api.md`` §3)."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_args", "body must be a JSON object")
    image = body.get("image")
    if not image or not isinstance(image, str):
        if body.get("template_hash_id"):
            raise ApiError(
                400, "invalid_args", "templates are not available in the sandbox; pass image"
            )
        raise ApiError(400, "invalid_args", "image is required")
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > CREATE_LABEL_MAX):
        raise ApiError(
            400, "invalid_args", f"label must be a string of at most {CREATE_LABEL_MAX} characters"
        )
    args = body.get("args")
    if args is not None and not isinstance(args, list):
        raise ApiError(400, "invalid_args", "args must be a list")
    script = len(body.get("onstart") or "") + len(str(body.get("args_str") or ""))
    script += sum(len(str(a)) for a in args or ())
    if script > CREATE_SCRIPT_MAX:
        raise ApiError(
            400,
            "invalid_args",
            f"onstart and args are {script} characters; at most {CREATE_SCRIPT_MAX} together",
        )
    return {
        "image": image,
        "disk": _disk(body.get("disk")),
        "label": label,
        "onstart": body.get("onstart") or "",
        "env": _env(body.get("env")),
        "runtype": body.get("runtype") or ("args" if args else "ssh"),
        "args": args,
        "price": _price(body.get("price")),
        "target_state": _target(body.get("target_state")),
        "template_hash_id": body.get("template_hash_id"),
        "image_login": _image_login(body.get("image_login")),
    }


def _image_login(value: Any) -> dict[str, str] | None:
    """The registry and user of ``image_login`` (docker login arguments, "-u USER -p TOKEN
    ghcr.io": vast-ai/docs creating-instances-with-api.mdx), never its password: Vast's
    documented instance object has no ``image_login`` (SDK 1.9.1 ``vastai/data/instance.py``:
    ``InstanceConfig`` sends it, ``Instance`` from ``GET /api/v1/instances/`` has no such
    field, while ``extra_env`` and ``onstart`` come back), so the sandbox keeps no copy of the
    token to show or leak. A non-string is refused (our reading: Vast documents a string)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(
            400, "invalid_args", "image_login must be a string of docker login arguments"
        )
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ApiError(400, "invalid_args", f"image_login does not parse: {exc}") from exc
    user, rest, flags = "", [], iter(words)
    for word in flags:
        if word in ("-u", "--username"):
            user = next(flags, "")
        elif word in ("-p", "--password"):
            next(flags, "")  # the password: read past, never kept
        elif not word.startswith("-"):
            rest.append(word)
    return {"registry": rest[-1] if rest else "docker.io", "user": user}


def _disk(value: Any) -> float:
    if value is None:
        return DEFAULT_DISK_GB
    try:
        disk = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "disk must be a number of GB") from exc
    if disk < DISK_MIN_GB:
        raise ApiError(400, "invalid_args", f"disk must be at least {DISK_MIN_GB:g} GB")
    return disk


def _env(value: Any) -> dict[str, str]:
    """``env`` as the SDK sends it (a JSON object); the OpenAPI's docker-flag string
    (``"-e A=b -p 8000:8000"``) is accepted too, but the object form is the reference."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, str):
        return _parse_docker_flags(value)
    raise ApiError(400, "invalid_args", "env must be an object of variable names to values")


def _parse_docker_flags(text: str) -> dict[str, str]:
    result, words = {}, shlex.split(text)
    for flag, value in itertools.pairwise(words):
        if flag == "-e" and "=" in value:
            key, _, val = value.partition("=")
            result[key] = val
        elif flag == "-p":
            result[f"-p {value}"] = "1"
    return result


def _price(value: Any) -> float | None:
    if value is None:
        return None
    try:
        price = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_price", "price must be a number") from exc
    if not PRICE_MIN <= price <= PRICE_MAX:
        raise ApiError(
            400, "invalid_price", f"price must be between {PRICE_MIN} and {PRICE_MAX} $/hour"
        )
    return price


def _target(value: Any) -> str:
    if value in (None, "running", "stopped"):
        return value or "running"
    raise ApiError(400, "invalid_args", "target_state must be 'running' or 'stopped'")


def _non_negative(value: Any, message: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", message) from exc
    if not number >= 0 or math.isinf(number):
        raise ApiError(400, "invalid_args", message)
    return number


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


def contract_end(inst: dict) -> float:
    """When INST's contract ends (``end_date``): created plus the offer's ``duration``; never
    for an offer that gives none (a hand-made market file)."""
    duration = float(json.loads(inst["offer"]).get("duration") or 0.0)
    return inst["created_at"] + duration if duration > 0 else float("inf")


def keeps_container_up(runtype: str) -> bool:
    """Whether the runtype's entrypoint outlives onstart (ssh, jupyter), as on Vast; ``args``
    runs the image's own command, and the container ends with it."""
    return any(kind in (runtype or "") for kind in ("ssh", "jupyter"))


def _script(config: dict) -> str:
    """What the container runs: the onstart script, or for the ``args`` runtype the
    entrypoint (carried in ``onstart`` by the CLI) followed by the args."""
    if config["runtype"] == "args" and config.get("args"):
        words = ([config["onstart"]] if config["onstart"] else []) + [
            str(a) for a in config["args"]
        ]
        return shlex.join(words) + "\n"
    return config["onstart"]


# The ticker thread lives with the engine it drives.
def run_ticker(engine: Engine, interval_s: float, stop: threading.Event) -> None:
    """Advance phases every ``interval_s``; move the interruptible market every hundredth of a
    sandbox hour (at most once a second: its hazard is integrated exactly, only when an outbid
    is applied waits for it); once a second, enforce credit and note liveness."""
    last_slow = last_bids = 0.0
    bids_every = min(1.0, max(interval_s, engine.bids.hour_s / 100))
    while not stop.wait(interval_s):
        try:
            engine.tick()
            if engine.clock() - last_bids >= bids_every:
                last_bids = engine.clock()
                engine.tick_bids()
            if engine.clock() - last_slow >= 1.0:
                last_slow = engine.clock()
                engine.enforce_credit()
                engine.enforce_expiry()
                engine.store.set_meta("alive", repr(last_slow))
        except Exception:  # one bad tick must not stop the market
            traceback.print_exc()
