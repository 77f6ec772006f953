"""The market weather played out (``sandbox/weather.py`` decides, this file applies): each new
rental's fate drawn at create, ``created`` lasting the weather's scheduling, pulls and downloads
at the machine's real link, a rental that never gets to running, hosts lost while loading,
downloading or running, and the progress ``status_msg`` shows while an image loads.

How a loss shows is how Vast shows it (``docs/vast-api.md`` §4): a host that *vanishes* takes
the instance out of the renter's list (show answers ``{"instances": null}``, destroy 404, as
noema saw "404 on terminate"); one that drops is listed ``offline`` ("host unreachable") until
the renter destroys it, billing nothing meanwhile. Either way its processes die with it, what it
used stays billed (storage from creation, the bytes it pulled), and its offer leaves the market
until the host is back (``weather.RELIST_MEAN_S``).

Weather ``none`` (the default, and what tests and ``--fast`` get unless they ask) draws no fate:
every method here is then a no-op and the sandbox runs exactly as before.
"""

from __future__ import annotations

import json
import math

from sandbox import weather
from sandbox.engine.core import EngineCore
from sandbox.timing import CONTAINER_START_S
from sandbox.weather import Fate, Traits


class WeatherFates(EngineCore):
    """Fates drawn, armed and met; the real link; the loading progress."""

    # ---- traits and fates -----------------------------------------------------------------

    def traits(self, ask_id: int, offer: dict | None = None) -> Traits:
        """The hidden traits of the machine behind ASK_ID in this sandbox's weather."""
        if ask_id not in self._traits:
            source = self.market.get(ask_id) or offer or {"id": ask_id}
            self._traits[ask_id] = weather.machine_traits(source, self.weather, self.timing.seed)
        return self._traits[ask_id]

    def fate_of(self, inst: dict) -> Fate | None:
        """INST's fate (None in weather ``none``)."""
        return Fate.from_dict(json.loads(inst["fate"])) if inst["fate"] else None

    def _draw_fate(self, inst_id: int, offer: dict) -> Fate | None:
        """At create: what this rental will meet, kept with it (a later restart under other
        flags does not change a rental's fate)."""
        if self.weather == weather.NONE:
            return None
        traits = self.traits(int(offer["id"]), offer)
        fate = weather.rental_fate(traits, self.timing.seed, inst_id)
        self.store.run(
            "UPDATE instances SET fate = ? WHERE id = ?", (json.dumps(fate.as_dict()), inst_id)
        )
        return fate

    def _created_until(self, inst_id: int, fate: Fate | None, now: float) -> float | None:
        """When ``created`` ends: the sandbox's own draw in weather ``none`` or under
        ``--scheduling-s``, the weather's otherwise (in weather ``none``, ``--start-weather``'s
        draw); never for a host that never picks the rental up."""
        if fate is not None and fate.never_ready == "created":
            return None
        fixed = self.timing.scheduling_fixed_s is not None
        if fate is None and self.timing.start_weather and not fixed:
            start = weather.provider_start_s(self.timing.start_weather, self.timing.seed, inst_id)
            return now + self.timing.drawn(start)
        if fate is None or fixed:
            return now + self.timing.scheduling_s(inst_id)
        return now + self.timing.drawn(fate.scheduling_s)

    # ---- the link --------------------------------------------------------------------------

    def link_mbps(self, inst: dict, direction: str) -> float:
        """What INST's link carries, Mbit/s: the advertised ``inet_down`` times the machine's
        link share for downloads and pulls (weather ``none``: the advertised), ``inet_up``."""
        offer = json.loads(inst["offer"])
        if direction != "down":
            return float(offer.get("inet_up", 100.0))
        advertised = float(offer.get("inet_down", 100.0))
        if self.weather == weather.NONE:
            return advertised
        return advertised * self.traits(inst["ask_id"], offer).link_factor

    def _pull_real_s(self, inst: dict) -> float:
        """Real seconds INST's image takes to pull over its link (the container start apart)."""
        return inst["image_bytes"] / (max(self.link_mbps(inst, "down"), 1.0) * 1e6 / 8)

    # ---- loading ---------------------------------------------------------------------------

    def _pull_plan(self, inst: dict, now: float) -> dict:
        """The fields a ``loading`` INST starts with: how long it lasts, when the pull's last
        byte is in, and what its fate does to it (a stall, a loss mid-pull)."""
        if inst["image_cached"]:
            seconds = self.timing.phase(CONTAINER_START_S, inst["id"], "start")
            return self._loading(now, seconds, pull_until=now)
        real_pull = self._pull_real_s(inst)
        seconds = self.timing.pull_s(inst["image_bytes"], self.link_mbps(inst, "down"), inst["id"])
        pull_until = now + seconds * real_pull / (real_pull + CONTAINER_START_S)
        plan = self._loading(now, seconds, pull_until)
        fate = self.fate_of(inst)
        if fate is None:
            return plan
        if fate.never_ready == "loading" and not inst["runs"]:
            # The pull stalls part way and never ends; status_msg shows it stop (``loading_msg``).
            return {**plan, "deadline": None, "fate_what": "stalled", "fate_at": None}
        survives_s = fate.load_loss_after_h * 3600 - inst["load_exposure_s"]
        if survives_s < real_pull:
            at = now + (pull_until - now) * max(survives_s, 0.0) / real_pull
            return {**plan, "fate_at": at, "fate_what": "loading"}
        return plan

    @staticmethod
    def _loading(now: float, seconds: float, pull_until: float) -> dict:
        return {
            "status": "loading",
            "deadline": now + seconds,
            "status_msg": "",
            "load_started": now,
            "pull_until": pull_until,
            "fate_at": None,
            "fate_what": "",
        }

    def pull_progress(self, inst: dict, now: float) -> float:
        """The share of its image a loading INST has pulled (a stalled pull stops where its fate
        says; 1.0 with the image already there)."""
        if inst["image_cached"] or inst["load_started"] is None:
            return 1.0
        span = (inst["pull_until"] or inst["load_started"]) - inst["load_started"]
        share = 1.0 if span <= 0 else min(max((now - inst["load_started"]) / span, 0.0), 1.0)
        fate = self.fate_of(inst)
        if fate is not None and inst["fate_what"] == "stalled":
            share = min(share, fate.stall_at)
        return share

    def loading_msg(self, inst: dict, now: float) -> str:
        """What ``status_msg`` says while INST loads: Docker's pull progress, which Vast relays
        (recorded instance bodies carry lines such as "0d30c18b26f8: Retrying in 5 seconds" and
        "Pulling from <repo>"). One layer stands for the whole image."""
        if inst["status"] != "loading" or inst["outbid"] or not inst["host_online"]:
            return ""
        image = json.loads(inst["config"])["image"]
        if inst["image_cached"]:
            return f"Status: Image is up to date for {image}"
        layer = weather.pull_layer(image)
        share = self.pull_progress(inst, now)
        fate = self.fate_of(inst)
        if inst["fate_what"] == "stalled" and fate is not None and share >= fate.stall_at:
            return f"{layer}: Retrying in 5 seconds"
        if share >= 1.0:
            return f"Status: Downloaded newer image for {image}"
        done, total = weather.human_size(share * inst["image_bytes"]), inst["image_bytes"]
        return f"{layer}: Downloading {done}/{weather.human_size(total)}"

    def _pull_done(self, inst: dict) -> None:
        """A pull finished: its seconds count towards the loading-or-downloading hazard."""
        if inst["fate"] and not inst["image_cached"]:
            self.store.run(
                "UPDATE instances SET load_exposure_s = load_exposure_s + ? WHERE id = ?",
                (self._pull_real_s(inst), inst["id"]),
            )

    # ---- running and downloading --------------------------------------------------------

    def _running_fate(self, inst: dict, now: float) -> dict:
        """Entering ``running``: when the running hazard's draw comes due, counting the running
        hours this rental already had (a reboot or an outbid in between does not reset it)."""
        fate = self.fate_of(inst)
        if fate is None or math.isinf(fate.run_loss_after_h):
            return {"fate_at": None, "fate_what": ""} if fate else {}
        left = fate.run_loss_after_h * self.timing.hour_s - self._running_wall_s(inst, now)
        return {"fate_at": now + max(left, 0.0), "fate_what": "running"}

    def _running_wall_s(self, inst: dict, now: float) -> float:
        """Wall seconds INST has run (its GPU-billed time)."""
        found = self.store.row(
            "SELECT COALESCE(SUM(COALESCE(stop, ?) - start), 0) AS s FROM usage"
            " WHERE instance_id = ? AND kind = 'gpu'",
            (now, inst["id"]),
        )
        return float(found["s"])

    def add_traffic(
        self, inst_id: int, direction: str, nbytes: int, now: float | None = None
    ) -> None:
        """Traffic billed as ever; a running rental's downloads also count towards its
        loading-or-downloading hazard, at the real seconds they take on its link (noema's hosts
        vanished "mid-download")."""
        super().add_traffic(inst_id, direction, nbytes, now)
        if direction == "down" and nbytes > 0 and self.weather != weather.NONE:
            self._downloaded(inst_id, nbytes, now or self.clock())

    def _downloaded(self, inst_id: int, nbytes: int, now: float) -> None:
        with self.store.tx():
            inst = self.get(inst_id)
            fate = self.fate_of(inst) if inst else None
            if fate is None or inst["destroyed_at"] is not None or inst["status"] != "running":
                return
            rate = max(self.link_mbps(inst, "down"), 1.0) * 1e6 / 8
            exposure = inst["load_exposure_s"] + nbytes / self.timing.byte_scale / rate
            self.store.run(
                "UPDATE instances SET load_exposure_s = ? WHERE id = ?", (exposure, inst_id)
            )
            if exposure >= fate.load_loss_after_h * 3600 and inst["host_online"]:
                self._lose(self.get(inst_id), now, fate.load_loss, "lost mid-download", fate)

    # ---- what comes due ---------------------------------------------------------------------

    def _meet_fates(self, now: float) -> None:
        """Run by ``tick``: every drawn loss whose moment came."""
        due = self.store.rows(
            "SELECT id FROM instances WHERE destroyed_at IS NULL AND host_online = 1"
            " AND fate_at IS NOT NULL AND fate_at <= ?",
            (now,),
        )
        for r in due:
            self._meet_fate(r["id"], now)

    def _meet_fate(self, inst_id: int, now: float) -> None:
        with self.store.tx():
            inst = self.get(inst_id)
            fate = self.fate_of(inst) if inst else None
            if fate is None or inst["fate_at"] is None or inst["fate_at"] > now:
                return
            if inst["fate_what"] == "loading" and inst["status"] == "loading":
                if not inst["outbid"]:
                    self._lose(inst, now, fate.load_loss, "lost while loading", fate)
                    return
            elif inst["fate_what"] == "running" and inst["status"] == "running":
                left = fate.run_loss_after_h * self.timing.hour_s - self._running_wall_s(inst, now)
                if left > 1e-3:  # it did not run all along (stopped, rebooted): not yet
                    self._update(inst_id, now, fate_at=now + left)
                    return
                self._lose(inst, now, fate.run_loss, "lost while running", fate)
                return
            self._update(inst_id, now, fate_at=None)  # moved on meanwhile: re-armed on _run

    def _lose(self, inst: dict, now: float, how: str, why: str, fate: Fate) -> None:
        """The host is lost (HOW: ``vanish`` or ``offline``): its processes die, what it pulled
        so far is billed, its offer leaves the market until the host is back."""
        self._bill_cut_pull(inst, now)
        common = {"deadline": None, "fate_at": None, "fate_what": f"lost: {why}"}
        if how == "vanish":
            _, pgid = self._release(
                inst["id"],
                now,
                event=f"host vanished ({why}, market weather)",
                destroyed_at=now,
                destroyed_by="host",
                **common,
            )
        else:
            _, pgid = self._release(
                inst["id"],
                now,
                event=f"host unreachable ({why}, market weather)",
                host_online=0,
                status_msg="host unreachable",
                **common,
            )
        back = fate.relist_after_s * self.timing.scale
        self.mark_gone(inst["ask_id"], now, None if math.isinf(back) else now + back)
        self.processes.kill(pgid)

    def _bill_cut_pull(self, inst: dict, now: float) -> None:
        """A pull cut short (the renter's destroy, a lost host) bills the bytes it got:
        bandwidth is billed per byte in any state (``docs/vast-api.md`` §7)."""
        if (
            inst["status"] != "loading"
            or inst["image_cached"]
            or inst["outbid"]
            or not inst["host_online"]
            or not self.bill_image_pull
        ):
            return
        got = int(inst["image_bytes"] * self.pull_progress(inst, now))
        self.add_traffic(inst["id"], "down", got, now)
