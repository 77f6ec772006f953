"""Where an instance's image comes from, and so how long ``loading`` lasts: pulled over the
offer's link, found on its machine from an earlier rental, or wiped from it meanwhile (the
machine's cache and the chance are ``sandbox/image_cache.py``). A finished pull is remembered on
the machine and, by default, billed as downloaded traffic.
"""

from __future__ import annotations

import json

from sandbox import image_cache
from sandbox.engine.core import EngineCore
from sandbox.state import log_event


class Images(EngineCore):
    """The image: pulled, or found on the machine; the container start."""

    def _load(self, inst: dict, now: float) -> dict:
        """Enter ``loading``: pull the image over the machine's link, or just start the
        container when the instance (a reboot, a restart) or its machine (an earlier rental's
        pull) already has it. The market weather's fate may stall the pull or cut it short
        (``weather_fates._pull_plan``)."""
        if not inst["image_cached"]:
            inst = self._look_for_image_on_machine(inst, now)
        plan = self._pull_plan(inst, now)
        loading = self._update(inst["id"], now, **plan)
        if plan["fate_what"] == "stalled":
            stall = self.fate_of(loading).stall_at
            log_event(
                self.store, inst["id"], now, "market weather", f"the pull stalls at {stall:.0%}"
            )
        return loading

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
        self._pull_done(inst)
        self.store.run("UPDATE instances SET image_cached = 1 WHERE id = ?", (inst["id"],))
        image = json.loads(inst["config"])["image"]
        image_cache.remember_pull(self.store, image_cache.machine_of(inst), image, now)
        if self.bill_image_pull:  # the pull crosses the host's metered link like any download
            self.add_traffic(inst["id"], "down", inst["image_bytes"], now)
