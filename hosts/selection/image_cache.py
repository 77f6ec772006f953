"""The chance a machine still holds the job's image, which prices its pull (``ImageCache``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageCache:
    """The chance each machine still holds the job's image, pulled there by an earlier rental:
    ``BY_MACHINE`` maps a machine id to it (``jobs.renting.image_cache.image_cached_odds`` decides
    it from the team's history); a machine not in it never pulled the image (chance 0).

    Only the image: Vast deletes an instance's disk with it (vast-ai/docs
    ``guides/instances/storage/types.mdx``), so a new instance never finds the model or a
    checkpoint there, whatever an earlier one downloaded. Image layers live in the host's
    Docker and outlast the instance (vast-ai/base-image ``README.md``, "Optimized for Fast
    Startup Through Layer Caching").
    """

    by_machine: Mapping[int, float] = field(default_factory=dict)
    words: Mapping[int, str] = field(default_factory=dict)  # where each chance came from

    def chance(self, machine_id: int | None) -> float:
        """The chance MACHINE_ID still holds the image (0 for one that never pulled it)."""
        if machine_id is None:
            return 0.0
        return min(max(float(self.by_machine.get(machine_id, 0.0)), 0.0), 1.0)


NO_IMAGE_CACHE = ImageCache()
