"""What the sandbox does on its own clock and across its restarts: the ticker thread, stopping
the instances of an account without credit and the contracts that expired, adopting or
rebooting instances after a restart, and powering every "host" off on shutdown.
"""

from __future__ import annotations

import threading
import traceback
from typing import TYPE_CHECKING

from sandbox import billing
from sandbox.engine.core import EngineCore, contract_end
from sandbox.processes import group_alive, group_belongs
from sandbox.timing import REBOOT_S

if TYPE_CHECKING:
    from sandbox.engine import Engine


class Upkeep(EngineCore):
    """Credit and contract ends, a restart's recovery, and shutdown."""

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
