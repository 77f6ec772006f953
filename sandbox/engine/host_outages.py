"""Injected host outages: a host cut off (``freeze``, a network partition; ``offline``) and
reachable again (``thaw``, ``online``), gone for good (``destroy``), or rebooting
(``reboot-host``) and back on its own (``_return_hosts``, run by ``tick``).

From outside a partitioned host looks alive: ``frozen`` still shows ``running``, while
``host_online = 0`` shows ``offline``. A renter's destroy sent to a host that is cut off waits
for it: the processes stay stopped, with the row's ``pgid`` kept, until the host is back and
the queued destroy arrives (``_deliver_queued_destroy``).
"""

from __future__ import annotations

import math
import signal
import threading
from typing import Any

from sandbox.engine.core import EngineCore
from sandbox.errors import ApiError
from sandbox.processes import signal_group
from sandbox.timing import DESTROY_DELIVERY_S, REBOOT_S


class HostOutages(EngineCore):
    """Hosts cut off, gone or rebooting, and back; the destroys queued for them."""

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
            self.mark_gone(inst["ask_id"], now)
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


def _non_negative(value: Any, message: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", message) from exc
    if not number >= 0 or math.isinf(number):
        raise ApiError(400, "invalid_args", message)
    return number
