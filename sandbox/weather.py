"""Market weather: how sandbox rentals fail on their own, the way Vast rentals do.

Plain functions of an offer, a weather, a seed and an instance id: no store, no clock. The
engine (``engine/weather_fates.py``) plays out what they decide; a bench or a test can ask them
the same questions without a server.

**A machine's hidden traits** (``machine_traits``), one seeded draw per (seed, machine), shared
by every weather so that a machine that is bad in ``typical`` is bad in ``bad`` too:

- its *frailty*: Vast's ``reliability2`` (weakly: the square root of its unreliability against
  the market's median, clamped to 0.5-2 times), its ``hosting_type`` (datacenter: a third) and
  a hidden lognormal factor (sigma 0.75, mean 1) that the score does not see;
- from it and the weather's mix: the chance a rental **never gets to running**, the hazard
  (per hour) of being **lost while loading or downloading**, the hazard **while running**;
- its **link**: the share of its advertised ``inet_down`` an image pull or a download gets;
- its **s/step**: the market file's hidden ``sim_speed_factor`` (1.0 = what its GPU model
  should do; the served ``dlperf`` already carries 1/√ of it), not redrawn here. The sandbox
  paces a job by it through ``$SANDBOX_DIR/slow`` (``SANDBOX_SLOW_FILE``, which the toy reads);
  a real training program ignores the file, so the sandbox never claims more than that.

**A rental's fate** (``rental_fate``), one seeded draw per (seed, instance id): how long
``created`` lasts, whether it never gets to running (stuck in ``created``, or a pull that stalls),
how many hours of loading or downloading it survives, how many running hours, and whether each
loss is a host that vanishes (gone from the instance list) or goes ``offline``.

**Calibration**: ``first_attempts.py`` plays a job's start out on these draws, without a clock;
over rentals of machines drawn at random from the bundled market, the three mixes give first
attempts that succeed about 95 %, 75 % and 40 % of the time (``bad``: noema's run).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass

from sandbox.timing import SCHEDULING_TRIANGLE_S

NONE = "none"
WEATHERS = (NONE, "good", "typical", "bad")
ENV_VAR = "SANDBOX_MARKET_WEATHER"  # the serve option's default, for the Procfile

# ---- provider start: created → running ------------------------------------------------------
# A host with the image cached: running 30-75 s after create. Vast's docs (manage-instances):
# "loading" is "normal for 30 seconds with cached images"; dumont-cloud's integration test (RTX
# 4090, 2026-01): create → running in 72.8 s; stationthis's research notes
# (lifehaverdev/stationthisdeluxebot, notes/research.md): "running" 30-60 s after create. So
# `created` lasts a triangle over 25-70 s (mode 35 s), then the 5 s container start.
CACHED_SCHEDULING_S = (25.0, 35.0, 70.0)  # low, mode, high
# A busy host: Vast's docs give an instance "2-5 minutes (not counting Docker image pull time)"
# to start (manage-instances, quickstart). The share of such rentals is the weather's.
BUSY_SCHEDULING_S = (120.0, 300.0)

# ---- frailty ------------------------------------------------------------------------------
# Vast's reliability ("historical uptime and health", new machines start at 0.6, it drops when
# "a client instance ... does not want to start"; docs/vast-api.md §8) predicts weakly: noema's
# May run was the first with its reliability filter really in effect (offers sorted by
# reliability, best first) and still succeeded 4 times in 10. A machine of the bundled market's
# median reliability (0.99) has factor 1; the factor follows the square root of 1 - reliability.
MEDIAN_UNRELIABILITY = 0.01
RELIABILITY_FACTOR = (0.5, 2.0)  # clamped to
# Vetted datacenters fail a third as often: noema's provider shootout
# (``2026-05-06-runpod-vs-vastai-shootout.md``): RunPod Secure 90 % vs Community 70 % success.
# Vast's datacenter filter (``hosting_type`` 1) is the same kind of vetting (docs/vast-api.md §8).
DATACENTER_FACTOR = 1 / 3
# What the score does not see (a guess, no public figure): a lognormal factor of mean 1.
HIDDEN_SIGMA = 0.75

# ---- how losses show ----------------------------------------------------------------------
# noema: of 5 hosts lost mid-download, 4 vanished ("404 on terminate") and 1 dropped SSH: a
# vanished host is gone from the instance list, a dropped one is listed `offline` here.
LOAD_LOSS_VANISH_SHARE = 0.8
RUN_LOSS_VANISH_SHARE = 0.5  # no public figure for losses while running: half and half
# A never-ready rental: a host whose daemon never picks the contract up stays `created`; the
# rest stall in their pull, somewhere in it (noema: "SSH never ready (5-min cap)", no status).
NEVER_READY_CREATED_SHARE = 1 / 3
STALL_AT = (0.05, 0.9)  # the share of the image pulled when a stalled pull stops
# A lost host is back on the market after an exponential time of this mean (real seconds; not
# published, a guess): the offer returns, and with it the chance to rent it again.
RELIST_MEAN_S = 3600.0


@dataclass(frozen=True)
class Mix:
    """One weather: what a machine of median frailty does, and how links and starts go."""

    never_ready: float  # the chance a rental never gets to running
    load_hazard_per_h: float  # losses per hour of pulling the image or downloading
    run_hazard_per_h: float  # losses per running hour
    busy_share: float  # rentals whose `created` lasts Vast's 2-5 minutes
    link_community: tuple[float, float]  # share of inet_down a pull gets, uniform in
    link_datacenter: tuple[float, float]


# Links: Vast's inet_down is its own speed test; a pull from a registry or a download from a
# bucket often gets less. noema moved 33 GB in 340-466 s (570-780 Mbit/s); its shootout saw a
# 30 GB image take 9-32 min on a cold community host (125-445 Mbit/s), against a bundled market
# whose median inet_down is 928 Mbit/s. Hazards of `bad` are fitted to noema (1 never ready, 5
# lost in the download of 10); `good` and `typical` to the 95 % and 75 %. Losses while
# running are guesses (no public rate): a median host lost once in 100 / 25 / 10 running hours.
MIXES = {
    NONE: Mix(0.0, 0.0, 0.0, 0.0, (1.0, 1.0), (1.0, 1.0)),
    "good": Mix(0.01, 0.18, 0.01, 0.0, (0.6, 1.0), (0.8, 1.0)),
    "typical": Mix(0.04, 1.5, 0.04, 0.2, (0.4, 1.0), (0.7, 1.0)),
    "bad": Mix(0.105, 9.1, 0.1, 0.4, (0.25, 0.9), (0.5, 1.0)),
}


@dataclass(frozen=True)
class Traits:
    """A machine's hidden traits in one weather (never served through the Vast API)."""

    machine_id: int
    weather: str
    frailty: float
    never_ready_p: float
    load_hazard_per_h: float
    run_hazard_per_h: float
    link_factor: float  # pulls and downloads get this share of the advertised inet_down
    down_mbps: float  # what they really get, Mbit/s
    step_factor: float  # s/step against its GPU model's (sim_speed_factor)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fate:
    """What one rental will meet, in real seconds and hours (the engine scales them)."""

    scheduling_s: float  # created → loading
    never_ready: str  # '' (it gets to running), 'created' or 'loading' (a stalled pull)
    stall_at: float  # the share of the image pulled when a stalled pull stops
    load_loss_after_h: float  # hours of pulling or downloading survived (inf: all)
    load_loss: str  # 'vanish' or 'offline'
    run_loss_after_h: float  # running hours survived (inf: all)
    run_loss: str
    relist_after_s: float  # a lost host's offer is back on the market after this long

    def as_dict(self) -> dict:
        return {k: (None if v == math.inf else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> Fate:
        return cls(**{k: (math.inf if v is None else v) for k, v in data.items()})


def weather_of(name: str | None) -> str:
    """NAME checked against ``WEATHERS`` (None or '' is ``none``)."""
    name = (name or NONE).strip().lower()
    if name not in MIXES:
        raise ValueError(f"market weather {name!r}: one of {', '.join(WEATHERS)}")
    return name


def machine_id_of(offer: dict) -> int:
    """The machine behind OFFER (its ask id in a hand-made market without ``machine_id``)."""
    return int(offer.get("machine_id") or offer["id"])


def reliability_factor(reliability: float) -> float:
    """How much frailer than the market's median a machine of this reliability is."""
    unreliability = max(1.0 - float(reliability), 0.0)
    low, high = RELIABILITY_FACTOR
    return min(max(math.sqrt(unreliability / MEDIAN_UNRELIABILITY), low), high)


def machine_traits(offer: dict, weather: str, seed: int | None) -> Traits:
    """OFFER's machine's hidden traits in WEATHER: one seeded draw per (SEED, machine)."""
    mix = MIXES[weather]
    machine = machine_id_of(offer)
    rng = random.Random(f"{seed or 0}:{machine}:weather-machine")
    hidden, link_draw = rng.gauss(0.0, 1.0), rng.random()
    datacenter = int(offer.get("hosting_type") or 0) == 1
    reliability = offer.get("reliability2", offer.get("reliability", 0.99))
    frailty = (
        reliability_factor(reliability)
        * (DATACENTER_FACTOR if datacenter else 1.0)
        * math.exp(HIDDEN_SIGMA * hidden - HIDDEN_SIGMA**2 / 2)
    )
    low, high = mix.link_datacenter if datacenter else mix.link_community
    link = low + (high - low) * link_draw
    return Traits(
        machine_id=machine,
        weather=weather,
        frailty=frailty,
        never_ready_p=1.0 - (1.0 - mix.never_ready) ** frailty,
        load_hazard_per_h=mix.load_hazard_per_h * frailty,
        run_hazard_per_h=mix.run_hazard_per_h * frailty,
        link_factor=link,
        down_mbps=max(float(offer.get("inet_down", 100.0)), 1.0) * link,
        step_factor=float(offer.get("sim_speed_factor", 1.0)),
    )


def rental_fate(traits: Traits, seed: int | None, instance_id: int) -> Fate:
    """What rental INSTANCE_ID of the machine with TRAITS meets: one seeded draw per (SEED,
    instance id). Its uniforms do not depend on the weather, so a rental that fails in
    ``typical`` fails in ``bad`` too."""
    rng = random.Random(f"{seed or 0}:{instance_id}:weather-fate")
    u = [rng.random() for _ in range(10)]
    mix = MIXES[traits.weather]
    never = ""
    if u[0] < traits.never_ready_p:
        never = "created" if u[1] < NEVER_READY_CREATED_SHARE else "loading"
    return Fate(
        scheduling_s=scheduling_s(traits.weather, seed, instance_id, u[2], u[3], mix),
        never_ready=never,
        stall_at=STALL_AT[0] + (STALL_AT[1] - STALL_AT[0]) * u[4],
        load_loss_after_h=_exponential(u[5], traits.load_hazard_per_h),
        load_loss="vanish" if u[6] < LOAD_LOSS_VANISH_SHARE else "offline",
        run_loss_after_h=_exponential(u[7], traits.run_hazard_per_h),
        run_loss="vanish" if u[8] < RUN_LOSS_VANISH_SHARE else "offline",
        relist_after_s=_exponential(u[9], 1.0 / RELIST_MEAN_S),
    )


def provider_start_s(weather: str, seed: int | None, instance_id: int) -> float:
    """``created`` → ``loading`` of rental INSTANCE_ID in WEATHER, the same draw as its fate's
    (``rental_fate``), for a sandbox that wants the weather's start without its failures."""
    rng = random.Random(f"{seed or 0}:{instance_id}:weather-fate")
    u = [rng.random() for _ in range(4)]
    return scheduling_s(weather, seed, instance_id, u[2], u[3], MIXES[weather])


def scheduling_s(
    weather: str, seed: int | None, instance_id: int, busy: float, where: float, mix: Mix
) -> float:
    """``created`` → ``loading`` in real seconds. ``none`` keeps the sandbox's own triangle
    (``timing.SCHEDULING_TRIANGLE_S``, the same draw as ``Timing.scheduling_s``); a weather
    draws a cached host's start, or a busy host's 2-5 minutes for its share of rentals."""
    if weather == NONE:
        low, mode, high = SCHEDULING_TRIANGLE_S
        return random.Random(f"{seed or 0}:{instance_id}:scheduling").triangular(low, high, mode)
    if busy < mix.busy_share:
        low, high = BUSY_SCHEDULING_S
        return low + (high - low) * where
    return _triangular(where, *CACHED_SCHEDULING_S)


def down_bytes_per_s(traits: Traits) -> float:
    """Real bytes per second a pull or a download gets on this machine."""
    return traits.down_mbps * 1e6 / 8


def pull_layer(image: str) -> str:
    """A stable 12-hex layer id for IMAGE's progress lines (Docker names layers so)."""
    return hashlib.sha256(image.encode()).hexdigest()[:12]


def human_size(nbytes: float) -> str:
    """Docker's progress sizes: decimal units, three significant digits ("1.21GB", "512MB")."""
    units = ("B", "kB", "MB", "GB", "TB")
    size, unit = float(nbytes), 0
    while size >= 1000 and unit < len(units) - 1:
        size, unit = size / 1000, unit + 1
    return f"{size:.3g}{units[unit]}"


def _exponential(u: float, rate: float) -> float:
    return -math.log(1.0 - u) / rate if rate > 0 else math.inf


def _triangular(u: float, low: float, mode: float, high: float) -> float:
    """The inverse of a triangular distribution's CDF at U."""
    cut = (mode - low) / (high - low)
    if u < cut:
        return low + math.sqrt(u * (high - low) * (mode - low))
    return high - math.sqrt((1 - u) * (high - low) * (high - mode))
