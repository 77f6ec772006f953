"""How a rental's start goes on the market weather's draws (``weather.py``), without a clock:
the same rules the engine plays out, for the calibration, its tests and the benches.

A first attempt *succeeds* when the instance gets to running and survives the job's start: its
image pull, a setup, the download that follows and its first minutes of running. The hazard of
loading or downloading counts the real seconds of pulling and downloading at the machine's real
link; the running hazard counts running time. Whichever draw comes first ends the rental.

The reference start is noema's re-baseline (``monygroupcorp/noema``,
``docs/benchmarks/2026-05-04-vastai-rebaseline.md``). ``python -m sandbox.first_attempts
[RENTALS] [SEED]`` prints the calibration: per weather, the measured first-attempt success over
RENTALS seeded rentals of machines drawn from the bundled market, where the failures happened,
and the time from create to running.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass

from sandbox.market import DEFAULT_MARKET, load_offers
from sandbox.timing import CONTAINER_START_S, IMAGE_BYTES
from sandbox.weather import (
    WEATHERS,
    Fate,
    Traits,
    down_bytes_per_s,
    machine_id_of,
    machine_traits,
    rental_fate,
)


@dataclass(frozen=True)
class Start:
    """What a job does when it starts on a fresh rental: the bytes it moves, then its first
    minutes of running (the calibration's "survives the job's start")."""

    image_bytes: int
    download_bytes: int = 0
    first_minutes: float = 10.0
    image_cached: bool = False
    setup_minutes: float = 0.0  # running, before the download starts


# noema's re-baseline: 33 GB of models from R2, after about 3 minutes of setup (its successes
# took 10.1-11.7 min in all, of which SSH 75-167 s and the download 340-466 s: the rest was
# installing ComfyUI and upgrading PyTorch); the image is the sandbox's pytorch/pytorch (3.6 GB);
# ten minutes of running after the download.
REFERENCE_START = Start(
    image_bytes=IMAGE_BYTES["pytorch/pytorch"],
    download_bytes=33_000_000_000,
    setup_minutes=3.0,
)


@dataclass(frozen=True)
class Outcome:
    """How a rental's start went, in real seconds from create."""

    succeeded: bool
    failed_in: str  # '' | 'never ready' | 'loading' | 'download' | 'running'
    running_after_s: float | None  # create → running (None: never)
    failed_after_s: float | None  # create → the loss (None: none, or never ready)


def start_outcome(traits: Traits, fate: Fate, start: Start) -> Outcome:
    """How START goes on a rental with this FATE, in real seconds from create."""
    if fate.never_ready:
        return Outcome(False, "never ready", None, None)
    rate = down_bytes_per_s(traits)
    pull_s = 0.0 if start.image_cached else start.image_bytes / rate
    survives_s = fate.load_loss_after_h * 3600
    if survives_s < pull_s:
        return Outcome(False, "loading", None, fate.scheduling_s + survives_s)
    running = fate.scheduling_s + pull_s + CONTAINER_START_S
    setup_s, download_s = start.setup_minutes * 60, start.download_bytes / rate
    losses = [(fate.run_loss_after_h * 3600, "running")]  # seconds after running
    if survives_s < pull_s + download_s:
        losses.append((setup_s + survives_s - pull_s, "download"))
    after, where = min(losses)
    if after < setup_s + download_s + start.first_minutes * 60:
        return Outcome(False, where, running, running + after)
    return Outcome(True, "", running, None)


def first_attempt_success(traits: Traits, fate: Fate, start: Start = REFERENCE_START) -> bool:
    """Whether the rental gets to running and survives START (the calibration's measure)."""
    return start_outcome(traits, fate, start).succeeded


def simulate_rentals(
    offers: list[dict], weather: str, seed: int | None, n: int, start: Start = REFERENCE_START
) -> list[Outcome]:
    """N first attempts, each on a machine drawn (seeded) from OFFERS, with instance ids from
    1: what the calibration measures."""
    pick = random.Random(f"{seed or 0}:rentals")
    traits = {machine_id_of(o): machine_traits(o, weather, seed) for o in offers}
    outcomes = []
    for instance_id in range(1, n + 1):
        machine = traits[machine_id_of(pick.choice(offers))]
        outcomes.append(start_outcome(machine, rental_fate(machine, seed, instance_id), start))
    return outcomes


def calibration(offers: list[dict], weather: str, seed: int, n: int) -> dict:
    """One weather's line of the calibration table: first-attempt success over N rentals of
    the reference start, where the failures happened, minutes from create to a failure, and
    seconds from create to running (p10 / p50 / p90), with the image pulled and cached."""
    outcomes = simulate_rentals(offers, weather, seed, n)
    cached = simulate_rentals(offers, weather, seed, n, Start(image_bytes=0, image_cached=True))
    failed = [o.failed_after_s / 60 for o in outcomes if o.failed_after_s is not None]
    return {
        "weather": weather,
        "rentals": n,
        "success": sum(o.succeeded for o in outcomes) / n,
        "failed_in": {k: v / n for k, v in sorted(Counter(o.failed_in for o in outcomes).items())},
        "failed_after_min_mean": statistics.mean(failed) if failed else None,
        "running_after_s": _deciles(o.running_after_s for o in outcomes),
        "running_after_s_cached": _deciles(o.running_after_s for o in cached),
    }


def _deciles(values) -> tuple[float, float, float]:
    found = sorted(v for v in values if v is not None)
    cuts = statistics.quantiles(found, n=10)
    return round(cuts[0]), round(cuts[4]), round(cuts[8])


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 10_000
    seed = int(argv[1]) if len(argv) > 1 else 11
    offers = load_offers(DEFAULT_MARKET)
    print(f"first attempts of the reference start, {n} rentals, seed {seed}")
    print("weather  success  never-ready loading download running  fail-min  run-s p10/50/90")
    for weather in WEATHERS:
        row = calibration(offers, weather, seed, n)
        where = [row["failed_in"].get(k, 0.0) for k in ("never ready", "loading", "download")]
        where.append(row["failed_in"].get("running", 0.0))
        mean = row["failed_after_min_mean"]
        print(
            f"{weather:8} {row['success']:7.1%}  "
            + " ".join(f"{w:7.1%}" for w in where)
            + f"  {mean if mean is None else round(mean, 1)!s:>8}"
            + f"  {row['running_after_s']} cached {row['running_after_s_cached']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
