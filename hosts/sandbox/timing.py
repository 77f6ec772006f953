"""How long simulated things take: scheduling, image pulls, reboots, transfers.

Every duration is a real-world estimate multiplied by ``scale`` (1.0 = real time). ``--fast``
sets scale 0.01 and clamps each phase to [0.1 s, 1 s], so an instance goes from created to
running in about half a second while the order of events stays the same. ``--seed`` adds a
deterministic jitter per instance. Billing always uses wall-clock seconds, never scaled
ones: the project's own spend records, which invoices are reconciled against, use wall time.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

# Real-world durations (seconds) of the phases Vast shows.
SCHEDULING_S = 3.0  # created → loading
CONTAINER_START_S = 5.0  # loading with the image already on the host
REBOOT_S = 8.0  # rebooting → loading
STOP_GRACE_S = 10.0  # docker stop: SIGTERM, then SIGKILL
# A host back from a partition picks up the destroy queued for it (a guess: Vast does not say).
DESTROY_DELIVERY_S = 10.0
RATE_LIMIT_MIN_SCALE = 0.25
# Compressed sizes of common images (bytes); others get a size drawn from their name.
IMAGE_BYTES = {
    "pytorch/pytorch": 3_600_000_000,
    "vastai/pytorch": 7_800_000_000,
    "vastai/base-image": 2_300_000_000,
    "nvidia/cuda": 2_900_000_000,
    "python": 400_000_000,
    "ubuntu": 30_000_000,
    "alpine": 3_500_000,
    "busybox": 2_200_000,
}


@dataclass(frozen=True)
class Timing:
    scale: float = 1.0
    floor_s: float = 0.0
    cap_s: float | None = None
    seed: int | None = None

    @classmethod
    def fast(cls, seed: int | None = None) -> Timing:
        return cls(scale=0.01, floor_s=0.1, cap_s=1.0, seed=seed)

    def phase(self, real_s: float, instance_id: int = 0, what: str = "") -> float:
        """A phase's simulated length in wall seconds."""
        seconds = real_s * self.scale * self.jitter(instance_id, what)
        if self.cap_s is not None:
            seconds = min(seconds, self.cap_s)
        return max(seconds, self.floor_s)

    @property
    def hour_s(self) -> float:
        """Wall seconds in one sandbox hour, the unit of the interruptible market's rates and of
        its min_bid walk (``bids``): scaled like everything else but never clamped, since it is
        a rate, not a phase (``--fast``: 36 s)."""
        return 3600.0 * self.scale

    def rate_interval(self, real_s: float) -> float:
        """A rate limit's minimum interval between calls: scaled like the phases, but never under
        ``RATE_LIMIT_MIN_SCALE`` of the real one, so two calls in a row from a client on a busy
        machine still meet the limit (a 0.01 s interval would let them through)."""
        return real_s * max(self.scale, RATE_LIMIT_MIN_SCALE)

    def jitter(self, instance_id: int, what: str) -> float:
        if self.seed is None:
            return 1.0
        return random.Random(f"{self.seed}:{instance_id}:{what}").uniform(0.8, 1.25)

    def bytes_per_s(self, mbit_per_s: float) -> float:
        """Transfer speed in wall time for a link of ``mbit_per_s`` (the offers' inet_down/up)."""
        return max(float(mbit_per_s), 1.0) * 1e6 / 8 / self.scale

    def pull_s(self, image_bytes: int, inet_down_mbit: float, instance_id: int) -> float:
        real = image_bytes / (max(inet_down_mbit, 1.0) * 1e6 / 8) + CONTAINER_START_S
        return self.phase(real, instance_id, "pull")


def image_bytes(image: str) -> int:
    """Download size of an image: known ones from the table, others 2-9 GB by name hash."""
    name = image.split("@")[0]
    head, _, tag = name.rpartition(":")
    if head and "/" not in tag:  # drop the tag, not a registry's port
        name = head
    name = name.removeprefix("docker.io/").removeprefix("library/")
    if name in IMAGE_BYTES:
        return IMAGE_BYTES[name]
    digest = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    return 2_000_000_000 + digest % 7_000_000_000
