"""How long simulated things take: scheduling, image pulls, reboots, transfers.

Every duration is a real-world estimate multiplied by ``scale`` (1.0 = real time); the
scheduling of a fresh instance is drawn from Vast's minutes (``SCHEDULING_TRIANGLE_S``). ``--fast``
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
# created → loading (Vast's scheduling: the host's daemon accepts the contract and readies the
# GPU and disk), drawn per instance from a triangle over 60-300 s with its mode at 120 s (median
# ~153 s). Sources: Vast's docs put an instance's start at "2-5 minutes (not counting Docker image
# pull time)" (vast-ai/docs, the manage-instances and quickstart pages); the field
# report's rent → first step of 4.5-8.5 min, less its image pull and 15 GB model download at
# 500-1,000 Mbit/s, leaves about 1.5-3.5 min; a third-party worker manager observed "running"
# 30-60 s after creation on a host with its image cached and a 2-3 min cold start to SSH
# (lifehaverdev/stationthisdeluxebot, src/core/services/vastai/notes/research.md). It was a flat
# 3 s before issue 30: a fresh rental then looked minutes faster than Vast's.
SCHEDULING_TRIANGLE_S = (60.0, 120.0, 300.0)  # low, mode, high
CONTAINER_START_S = 5.0  # loading with the image already on the host
REBOOT_S = 8.0  # rebooting → loading
STOP_GRACE_S = 10.0  # docker stop: SIGTERM, then SIGKILL
# A host back from a partition picks up the destroy queued for it (a guess: Vast does not say).
DESTROY_DELIVERY_S = 10.0
RATE_LIMIT_MIN_SCALE = 0.25
# A host that reboots (``reboot-host``) comes back this often, after an exponential time of
# this mean (real seconds; not found published: the supervisor's prior in
# ``hosts.wait_or_move`` uses the same figures). The rest never come back.
HOST_RETURN_P = 0.5
HOST_RETURN_MEAN_S = 300.0
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
    host_return_p: float = HOST_RETURN_P
    host_return_mean_s: float = HOST_RETURN_MEAN_S
    # --scheduling-s: a fixed created → loading instead of the draw (tests that want it short).
    scheduling_fixed_s: float | None = None
    # --byte-scale B: links carry B times their bytes per second, for a caller that sends B times
    # the bytes (a bench whose 15 GB model is 15 MB): transfer times keep their real proportion
    # while the CPU moves a thousandth of the data. Image pulls move no bytes and ignore it.
    byte_scale: float = 1.0
    # --image-size NAME=BYTES: sizes that extend (and win over) the IMAGE_BYTES table.
    image_sizes: tuple[tuple[str, int], ...] = ()
    # --start-weather W: created → loading drawn as weather W draws it (weather.py: a cached
    # host's 25-70 s, a busy host's 2-5 minutes), with none of W's failures (a bench that times
    # moves on the calibrated start: bench/support/field_report.py). "" keeps the triangle.
    start_weather: str = ""

    @classmethod
    def fast(cls, seed: int | None = None) -> Timing:
        # Scheduling stays the flat 3 s it was (0.1 s here): drawn, it would hit the 1 s cap
        # on every one of the suite's rentals; the order of events is what --fast keeps.
        return cls(scale=0.01, floor_s=0.1, cap_s=1.0, seed=seed, scheduling_fixed_s=3.0)

    def phase(self, real_s: float, instance_id: int = 0, what: str = "") -> float:
        """A phase's simulated length in wall seconds."""
        seconds = real_s * self.scale * self.jitter(instance_id, what)
        if self.cap_s is not None:
            seconds = min(seconds, self.cap_s)
        return max(seconds, self.floor_s)

    def scheduling_s(self, instance_id: int) -> float:
        """created → loading in wall seconds: a draw from SCHEDULING_TRIANGLE_S, seeded by
        ``--seed`` (0 without one) and the instance id, so a run can be repeated; clamped like
        every phase (``--fast``: 1 s)."""
        if self.scheduling_fixed_s is not None:
            return self.phase(self.scheduling_fixed_s, instance_id, "scheduling")
        low, mode, high = SCHEDULING_TRIANGLE_S
        draw = random.Random(f"{self.seed or 0}:{instance_id}:scheduling").triangular(
            low, high, mode
        )
        return self.drawn(draw)

    def drawn(self, real_s: float) -> float:
        """A phase drawn elsewhere (real seconds: the scheduling above, the market weather's)
        in wall seconds: scaled and clamped like every phase, with no jitter of its own."""
        seconds = real_s * self.scale
        if self.cap_s is not None:
            seconds = min(seconds, self.cap_s)
        return max(seconds, self.floor_s)

    @property
    def hour_s(self) -> float:
        """Wall seconds in one sandbox hour, the unit of the interruptible market's rates and of
        its min_bid walk (``bids``): scaled like everything else but never clamped, since it is
        a rate, not a phase (``--fast``: 36 s)."""
        return 3600.0 * self.scale

    def host_return_s(self, instance_id: int, spell: int) -> float | None:
        """Wall seconds until a rebooted host comes back (its SPELL-th time offline), drawn
        from ``--seed``; None when it never does. Scaled but never clamped: under ``--fast``
        a 5-minute return is 3 s, not the 1 s every phase is capped at."""
        rng = random.Random(f"{self.seed}:{instance_id}:host-return:{spell}")
        if rng.random() >= self.host_return_p:
            return None
        return rng.expovariate(1.0 / self.host_return_mean_s) * self.scale

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
        return max(float(mbit_per_s), 1.0) * 1e6 / 8 / self.scale * self.byte_scale

    def pull_s(self, image_bytes: int, inet_down_mbit: float, instance_id: int) -> float:
        real = image_bytes / (max(inet_down_mbit, 1.0) * 1e6 / 8) + CONTAINER_START_S
        return self.phase(real, instance_id, "pull")

    def image_bytes(self, image: str) -> int:
        """Download size of IMAGE: ``--image-size`` first, then ``image_bytes``'s table."""
        sizes = dict(self.image_sizes)
        name = image_name(image)
        return sizes[name] if name in sizes else image_bytes(image)


def image_bytes(image: str) -> int:
    """Download size of an image: known ones from the table, others 2-9 GB by name hash."""
    name = image_name(image)
    if name in IMAGE_BYTES:
        return IMAGE_BYTES[name]
    digest = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    return 2_000_000_000 + digest % 7_000_000_000


def image_name(image: str) -> str:
    """IMAGE without its digest, tag and Docker Hub prefixes: the table's key."""
    name = image.split("@")[0]
    head, _, tag = name.rpartition(":")
    if head and "/" not in tag:  # drop the tag, not a registry's port
        name = head
    return name.removeprefix("docker.io/").removeprefix("library/")
