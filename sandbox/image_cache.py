"""Docker images a machine keeps between rentals, and the chance its host wiped them.

What real Vast does, as far as it is published:

- An instance's own disk is deleted with it ("Container Storage ... Deleted with instance: All
  data is permanently lost when instance is destroyed", vast-ai/docs
  ``guides/instances/storage/types.mdx``): nothing the job downloaded survives a new rental.
- Image layers live in the host's Docker, not in the instance: "Vast.ai host machines cache
  commonly-used Docker image layers ... most of the image content is already present on host
  machines before you even start your instance" (vast-ai/base-image ``README.md``, "Optimized
  for Fast Startup Through Layer Caching"); Vast's docs time a start as "2-5 minutes (not
  counting Docker image pull time)" (vast-ai/docs, the manage-instances and quickstart pages).
  A later instance on a machine that pulled the image starts without pulling it.
- How often a host prunes its images between rentals is not published (no page of vast-ai/docs
  or the host guides gives it). ``GUESSED_WIPE_CHANCE`` is our guess: hosts run with finite
  disks and prune now and then, so one later rental in five finds the image gone.

So the sandbox keeps, per machine (the offer's ``machine_id``), the images an instance of it
finished pulling. A later instance on that machine draws once, seeded by the sandbox's seed and
its own id, whether the host wiped the image meanwhile; if not, its ``loading`` is the container
start only and no image bytes cross the metered link.
"""

from __future__ import annotations

import json
import random

from sandbox.state import Store

GUESSED_WIPE_CHANCE = 0.2  # not published: a guess (module docstring)


def machine_of(inst: dict) -> int:
    """The machine INST runs on: its offer's ``machine_id`` (the ask id for a hand-made market
    file without one, where each ask is its own machine)."""
    offer = json.loads(inst["offer"])
    return int(offer.get("machine_id") or inst["ask_id"])


def holds(store: Store, machine_id: int, image: str, *, before: float) -> bool:
    """Whether MACHINE_ID finished pulling IMAGE before BEFORE (an earlier rental's pull)."""
    found = store.row(
        "SELECT 1 AS x FROM machine_images WHERE machine_id = ? AND image = ? AND pulled_at < ?",
        (machine_id, image, before),
    )
    return found is not None


def remember_pull(store: Store, machine_id: int, image: str, now: float) -> None:
    """MACHINE_ID now holds IMAGE (kept at its first pull's time)."""
    store.run(
        "INSERT OR IGNORE INTO machine_images (machine_id, image, pulled_at) VALUES (?, ?, ?)",
        (machine_id, image, now),
    )


def forget(store: Store, machine_id: int, image: str) -> None:
    """The host wiped IMAGE from MACHINE_ID."""
    store.run("DELETE FROM machine_images WHERE machine_id = ? AND image = ?", (machine_id, image))


def wiped_between_rentals(seed: int | None, instance_id: int, chance: float) -> bool:
    """Whether the host wiped the image before INSTANCE_ID's rental: one seeded draw per
    instance, so a second run with the same seed and the same ids meets the same wipes."""
    if chance <= 0:
        return False
    return random.Random(f"{seed}:{instance_id}:image-wipe").random() < chance
