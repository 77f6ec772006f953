"""The phases Vast shows: ``created`` → ``loading`` → ``running`` as each runs out (the
ticker's ``tick``), the onstart script started on ``running``, and ``exited`` when the
container ends on its own.
"""

from __future__ import annotations

import json

from sandbox.engine.core import EngineCore
from sandbox.engine.create_body import container_script
from sandbox.processes import instance_env


class Phases(EngineCore):
    """The phases: advance what ran out, run the onstart, notice an exit."""

    def tick(self) -> None:
        """Advance every instance whose current phase has run out."""
        now = self.clock()
        self._return_hosts(now)
        self._meet_fates(now)  # weather_fates.py: losses the market weather drew
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

    def _run(self, inst: dict, now: float) -> dict:
        """Enter ``running`` and start the onstart script (if there is one)."""
        config = json.loads(inst["config"])
        pgid = None
        if container_script(config).strip():
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
            **self._running_fate(inst, now),
        )

    def _env(self, inst: dict, config: dict) -> dict[str, str]:
        host_port = self.url.split("//", 1)[-1]
        user_env = config["env"]
        if inst["fate"]:
            # Under a market weather the toy trains at the machine's s/step: it reads its
            # slowdown (sim_speed_factor x an injected slow) from this file (weather.py).
            user_env = {"SANDBOX_SLOW_FILE": str(self.scratch(inst["id"]) / "slow"), **user_env}
        return instance_env(
            instance_id=inst["id"],
            api_key=inst["api_key"],
            user_env=user_env,
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


def keeps_container_up(runtype: str) -> bool:
    """Whether the runtype's entrypoint outlives onstart (ssh, jupyter), as on Vast; ``args``
    runs the image's own command, and the container ends with it."""
    return any(kind in (runtype or "") for kind in ("ssh", "jupyter"))
