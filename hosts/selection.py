"""Offer selection: which Vast offer to rent for a job, by the expected TOTAL cost of the job.

Plain data in, plain data out (``hosts.vast.Offer`` and the dataclasses below); no Django, no
network, so it runs the same on a live search, the sandbox and a market file.

The cost model (``estimate_cost``), in the units of ``hosts.vast`` (GB = GiB = 1024³ bytes, the
unit traffic is priced in; bandwidth in Mbit/s; prices per hour / per GB / per GB-hour):

=================  ============================================================================
start-up           ``image_pull_h``     image size / inet_down (Vast state ``loading``), x (1 - the
                                        chance the machine kept the image: ``ImageCache``)
                   ``model_download_h`` model (+ checkpoint when resuming) / inet_down
                   ``container_start_h`` fixed overhead (``JobProfile.container_start_s``;
                   once measured, ``start_s``, which holds the command's downloads too)
training           ``train_h``          (steps_total - steps_done) * seconds per step
GPU                ``dph_base`` * (model download + container start + training)
storage            storage $/GB/h * ``Requirements.disk_gb`` * (start-up + training)
traffic            (image x (1 - that chance) + model [+ checkpoint]) GB * download $/GB
                   + upload_gb * remaining share of the run * upload $/GB
=================  ============================================================================

What start-up time is billed at the GPU rate (shared/vast-api.md §7): Vast bills the GPU from
``running`` on, not while ``loading`` — and ``loading`` is the image pull, so the pull costs
storage and traffic but no GPU time. The model download is done by our agent inside the
running container, so it IS billed GPU time (the field report's $0.81 first attempt: 15 GB
of model pulled over a metered link while the host was already billing). The container-start
overhead (agent start, imports, loading weights onto the GPU) also happens after ``running``
and is billed (docker's own few seconds of start belong to ``loading``; counting them too
errs on the dear side). Storage is billed from creation, so it covers the whole start-up.

Preemption (``expected_cost``): a rental is on-demand or interruptible, a bid of ``min_bid`` x
(1 + margin). Each is charged its expected rework: λ (interruptions per rented hour, for that
rental type, GPU model and bid margin: ``PreemptionRates``, the team's own history blended with
a documented prior) x the expected hours gives the expected interruptions, and each costs the
detection, a new rent, a start-up again (image, model and checkpoint downloads at the offer's
bandwidth) and half a checkpoint interval of training done again. ``rental: auto`` takes the
cheaper expected total; the bid margin is chosen the same way (a higher bid, fewer
preemptions).

Not modelled: checkpoint uploads overlap training (they cost traffic, not time); a host's link
is assumed to deliver its advertised ``inet_down``; the replacement host is priced like this one.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hosts.vast import MIB_PER_GIB, Offer
from hosts.vast.parsing import BID_MAX_USD, BID_MIN_USD, CHANGE_BID_MAX_USD

BYTES_PER_GB = 1024**3  # traffic is priced per 1024³ bytes (hosts.vast, sandbox billing)
BITS_PER_MBIT = 1_000_000  # link speeds are decimal megabits
SECONDS_PER_HOUR = 3600.0
# Per-GPU DLPerf of a healthy card, used only when the offers at hand hold none of the
# reference model. RTX 4090: shared/market/README.md anchors it at 100 (106.6 seen on Vast).
KNOWN_DLPERF_PER_GPU: Mapping[str, float] = {"RTX 4090": 100.0}
DEFAULT_TOP_N = 5

# Speed sources, best first: observed on this machine, observed on this GPU model, estimated
# from the offer's DLPerf, estimated from its model's typical DLPerf (the offer has none).
SPEED_MACHINE, SPEED_MODEL, SPEED_DLPERF, SPEED_DLPERF_MODEL = (
    "machine",
    "model",
    "dlperf",
    "dlperf-model",
)


class CannotEstimate(ValueError):
    """The offer lacks what the cost model needs (a price, a bandwidth, any speed estimate)."""


# --- What the job needs -------------------------------------------------------------------


def _gpu_name(name: str) -> str:
    # Vast's CLI writes RTX_4090 for "RTX 4090"; the API and offers use spaces (ref §2).
    return str(name).replace("_", " ").strip()


@dataclass(frozen=True)
class Requirements:
    """What an offer must have to be considered at all (DESIGN.md, "Renting").

    ``min_gpu_ram_gb`` is per GPU in GiB as the driver reports it: a "24 GB" RTX 4090 shows
    23.99 GiB, so ask for what the model needs, not for the card's nominal size.
    ``num_gpus`` is matched exactly: extra GPUs would be billed and sit idle.
    ``disk_gb`` is the disk to allocate, which is also the storage billed.
    ``rental`` has no default: how to rent is the product's choice, made once in ``JobSpec``
    (``jobs.market_terms`` gives every field from there); the defaults below only save tests
    and benchmarks typing, and never stand in for a job's own value.
    """

    gpu_names: tuple[str, ...] = ()  # empty: any model
    num_gpus: int = 1
    min_gpu_ram_gb: float = 0.0
    min_reliability: float = 0.98
    min_inet_down_mbps: float = 500.0
    disk_gb: float = 50.0
    min_cuda: float | None = None
    verified_only: bool = True
    datacenter_only: bool = False
    max_dph: float | None = None  # $/h, compared with dph_total (GPU + this job's storage)
    avoid_machine_ids: frozenset[int] = frozenset()
    rental: str = field(kw_only=True)  # "on-demand" | "interruptible" | "auto"
    max_bid_dph: float | None = None  # the highest bid $/h an interruptible rental may place
    bid_margins: tuple[float, ...] = ()  # the margins over min_bid to weigh; empty: BID_MARGINS

    def __post_init__(self) -> None:
        # Accept what JSON gives (lists, "RTX_4090") and keep the frozen object hashable.
        object.__setattr__(self, "gpu_names", tuple(_gpu_name(n) for n in self.gpu_names))
        avoid = frozenset(int(m) for m in self.avoid_machine_ids)
        object.__setattr__(self, "avoid_machine_ids", avoid)
        object.__setattr__(self, "bid_margins", tuple(float(m) for m in self.bid_margins))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples and sets become sorted lists."""
        data = asdict(self)
        data["gpu_names"] = list(self.gpu_names)
        data["avoid_machine_ids"] = sorted(self.avoid_machine_ids)
        data["bid_margins"] = list(self.bid_margins)
        return data


# Offers asked for in one search. Vast documents neither its default nor its maximum, and its
# default order is its own `score`: the cost ranking needs every offer that passes the filter,
# so ask for many (the sandbox answers 64 when `limit` is missing, to make forgetting it show).
SEARCH_LIMIT = 256


def vast_query(req: Requirements) -> dict[str, Any]:
    """The server-side prefilter for ``VastClient.search_offers`` in Vast's query language.

    ``allocated_storage`` makes Vast price ``dph_total`` for this job's disk and doubles as a
    ``disk_space >=`` filter (ref §2). ``filter_offers`` still re-checks every rule locally,
    so a server that ignores a key only costs bandwidth, never a wrong rental.
    """
    query: dict[str, Any] = {
        "num_gpus": {"eq": req.num_gpus},
        "reliability": {"gte": req.min_reliability},
        "inet_down": {"gte": req.min_inet_down_mbps},
        "disk_space": {"gte": req.disk_gb},
        # None: no condition at all (the client drops the key, as the CLI's "any" does);
        # without the key the client would add its `verified eq true` default.
        "verified": {"eq": True} if req.verified_only else None,
        "allocated_storage": req.disk_gb,
    }
    if req.gpu_names:
        names = list(req.gpu_names)
        query["gpu_name"] = {"eq": names[0]} if len(names) == 1 else {"in": names}
    if req.min_gpu_ram_gb:
        query["gpu_ram"] = {"gte": req.min_gpu_ram_gb * MIB_PER_GIB}  # Vast's "MB" are MiB
    if req.min_cuda is not None:
        query["cuda_max_good"] = {"gte": req.min_cuda}
    if req.datacenter_only:
        query["datacenter"] = {"eq": True}
    if req.max_dph is not None:
        query["dph_total"] = {"lte": req.max_dph}
    if req.avoid_machine_ids:
        query["machine_id"] = {"notin": sorted(req.avoid_machine_ids)}
    return query


# --- Filtering ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    """Why one offer was not considered: the first rule it failed, in words for the job page."""

    offer_id: int
    machine_id: int | None
    rule: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def job_dph_total(offer: Offer, disk_gb: float) -> float | None:
    """$/h of GPU plus this job's storage, i.e. what Vast shows as ``dph_total``.

    Computed from the parts when they are known, because an offer's own ``dph_total`` is
    priced for whatever ``allocated_storage`` its search used (market files carry none).
    """
    if offer.dph_base is None or offer.storage_usd_per_gb_hour is None:
        return offer.dph_total
    return offer.dph_base + offer.storage_usd_per_gb_hour * disk_gb


def _at_least(value: float | None, minimum: float, what: str) -> str | None:
    if value is None:
        return f"{what} unknown"
    return f"{what} {value:g} < {minimum:g}" if value < minimum else None


def _avoided(o: Offer, r: Requirements) -> str | None:
    if o.machine_id is not None and o.machine_id in r.avoid_machine_ids:
        return f"machine {o.machine_id} is on the job's avoid list"
    return None


def _wrong_model(o: Offer, r: Requirements) -> str | None:
    if r.gpu_names and o.gpu_name not in r.gpu_names:
        return f"{o.gpu_name or 'unknown GPU'} is not one of {', '.join(r.gpu_names)}"
    return None


def _wrong_count(o: Offer, r: Requirements) -> str | None:
    return None if o.num_gpus == r.num_gpus else f"{o.num_gpus} GPUs, need {r.num_gpus}"


def _too_little_vram(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.gpu_ram_gb, r.min_gpu_ram_gb, "GiB per GPU") if r.min_gpu_ram_gb else None


def _unverified(o: Offer, r: Requirements) -> str | None:
    return "host not verified" if r.verified_only and not o.verified else None


def _not_datacenter(o: Offer, r: Requirements) -> str | None:
    return "not a datacenter host" if r.datacenter_only and not o.datacenter else None


def _unreliable(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.reliability, r.min_reliability, "reliability")


def _slow_link(o: Offer, r: Requirements) -> str | None:
    # A link of 0 Mbit/s would make every download last forever, whatever the minimum says.
    if o.inet_down_mbps is not None and o.inet_down_mbps <= 0:
        return "no download bandwidth"
    return _at_least(o.inet_down_mbps, r.min_inet_down_mbps, "download Mbit/s")


def _small_disk(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.disk_space_gb, r.disk_gb, "free disk GB")


def _old_cuda(o: Offer, r: Requirements) -> str | None:
    return None if r.min_cuda is None else _at_least(o.cuda_max_good, r.min_cuda, "max CUDA")


def _unpriced(o: Offer, r: Requirements) -> str | None:
    # A missing traffic price could hide the $45/TB host of the field report: never assume 0.
    prices = {
        "GPU $/h": o.dph_base,
        "storage $/GB": o.storage_usd_per_gb_hour,
        "download $/GB": o.download_usd_per_gb,
        "upload $/GB": o.upload_usd_per_gb,
    }
    missing = [name for name, value in prices.items() if value is None]
    return f"no price for {', '.join(missing)}" if missing else None


def _too_expensive(o: Offer, r: Requirements) -> str | None:
    if r.max_dph is None:
        return None
    total = job_dph_total(o, r.disk_gb)
    if total is None:
        return "dph_total unknown"
    return f"${total:.3f}/h > ${r.max_dph:.3f}/h" if total > r.max_dph else None


# Checked in this order; an offer is reported under the first rule it fails.
RULES: tuple[tuple[str, Callable[[Offer, Requirements], str | None]], ...] = (
    ("avoid_list", _avoided),
    ("gpu_name", _wrong_model),
    ("num_gpus", _wrong_count),
    ("gpu_ram", _too_little_vram),
    ("verified", _unverified),
    ("datacenter", _not_datacenter),
    ("reliability", _unreliable),
    ("inet_down", _slow_link),
    ("disk_space", _small_disk),
    ("cuda", _old_cuda),
    ("unknown_price", _unpriced),
    ("max_dph", _too_expensive),
)
RULE_UNKNOWN_SPEED = "unknown_speed"  # added by rank_offers: no way to estimate the duration
RULE_CONTRACT = "contract_duration"  # added by rank_offers: the host's contract ends too soon
# How much longer than the job's expected rest a host's contract must run: estimates are off
# (a slow host did 6 s/step instead of 4 in the field report), and a recovery adds time.
CONTRACT_MARGIN = 0.5  # +50 % of the expected hours ...
CONTRACT_SLACK_H = 1.0  # ... and an hour


def contract_too_short(offer: Offer, cost: CostBreakdown) -> str | None:
    """Why OFFER's contract would end before the job could (its ``duration`` is shorter than the
    expected rest plus ``CONTRACT_MARGIN`` and ``CONTRACT_SLACK_H``), or None if it is long
    enough or unknown."""
    if offer.duration_s is None:
        return None
    left_h, needed_h = offer.duration_s / SECONDS_PER_HOUR, cost.wall_h
    if left_h >= needed_h * (1 + CONTRACT_MARGIN) + CONTRACT_SLACK_H:
        return None
    return f"contract ends in {left_h:.1f} h; the job needs about {needed_h:.1f} h"


def first_failed_rule(offer: Offer, req: Requirements) -> Rejection | None:
    """The first requirement the offer fails, or None when it meets them all."""
    for rule, check in RULES:
        detail = check(offer, req)
        if detail is not None:
            return Rejection(offer.id, offer.machine_id, rule, detail)
    return None


def filter_offers(
    offers: Iterable[Offer], req: Requirements
) -> tuple[list[Offer], list[Rejection]]:
    """Split offers into those meeting ``req`` (order kept) and a rejection for each other."""
    kept: list[Offer] = []
    rejected: list[Rejection] = []
    for offer in offers:
        rejection = first_failed_rule(offer, req)
        if rejection is None:
            kept.append(offer)
        else:
            rejected.append(rejection)
    return kept, rejected


# --- Speed ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobProfile:
    """What the job moves and computes; the numbers the cost model multiplies.

    ``reference_seconds_per_step`` is measured on ``Requirements.num_gpus`` GPUs of the
    ``reference_gpu`` model (field report: 4 s/step on one RTX 4090). ``upload_gb`` is what the
    whole run uploads (checkpoints); a resumed run is charged its remaining share.
    ``checkpoint_gb`` is downloaded before resuming (only when ``steps_done`` > 0).
    A job's profile is given every field by ``jobs.market_terms`` from ``JobSpec``; the
    defaults here are the same numbers, for tests and benchmarks.
    """

    image_gb: float
    model_gb: float
    upload_gb: float
    steps_total: int
    steps_done: int = 0
    reference_seconds_per_step: float = 4.0
    reference_gpu: str = "RTX 4090"
    container_start_s: float = 60.0
    checkpoint_gb: float = 0.0
    checkpoint_every_steps: int = 0  # 0: unknown, taken as a tenth of the run
    # "script" or "auto" (the supervisor also asks, jobs.checkpoint_interval); the cost model
    # does not read it: it rides along in the job's profile.
    checkpoint: str = "script"
    # Measured on earlier runs of the job (``jobs.measured``), None until then: the GPU-billed
    # seconds a run spends besides its steps (agent start, setup, the command's own downloads,
    # the last upload, exit), in place of ``container_start_s`` and of the model download at
    # the offer's bandwidth (its traffic is still priced from ``model_gb``); and the seconds
    # from rent to container up, in place of the image at the offer's bandwidth.
    start_s: float | None = None
    pull_s: float | None = None

    @property
    def steps_remaining(self) -> int:
        """Steps still to train from the resume point."""
        return max(self.steps_total - self.steps_done, 0)

    @property
    def share_remaining(self) -> float:
        """The part of the run still ahead (0-1); uploads are charged for this part only."""
        return self.steps_remaining / self.steps_total if self.steps_total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


# Several GPUs of one host (issue 31). The same command on N GPUs instead of M: data parallel
# as ``torchrun``/``accelerate`` and HF ``Trainer`` run it, each GPU its own per-device batch,
# so a step does N/M times the work on N/M times the GPUs and takes as long, less what the
# gradient all-reduce costs: each doubling of the GPUs keeps ``MULTI_GPU_EFFICIENCY`` of the
# per-GPU throughput, the rule the market file's DLPerf of an n-GPU offer follows
# (shared/market/README.md: per-GPU DLPerf x n x 0.95^log2(n)). A script that splits a fixed
# global batch instead trains faster per step than this says: the estimate errs on the dear
# side, as the budget wants. Used only where no run measured the job's own GPU count.
MULTI_GPU_EFFICIENCY = 0.95


def seconds_per_step_at(spp: float, *, measured_gpus: int, num_gpus: int) -> float:
    """Seconds per step of the same command on NUM_GPUS GPUs, from SPP measured on
    MEASURED_GPUS GPUs of the same model (``MULTI_GPU_EFFICIENCY``): 2 s on one GPU reads
    2.22 s on four, 1.80 s back on one from 2 s on four."""
    if measured_gpus <= 0 or num_gpus <= 0 or measured_gpus == num_gpus:
        return spp
    return spp / MULTI_GPU_EFFICIENCY ** math.log2(num_gpus / measured_gpus)


def _per_gpu_dlperf(offer: Offer) -> float | None:
    if not offer.dlperf or offer.dlperf <= 0 or offer.num_gpus <= 0:
        return None
    return offer.dlperf / offer.num_gpus


@dataclass(frozen=True)
class SpeedBook:
    """Training speed known for this job: observed seconds/step, and DLPerf to estimate the rest.

    ``by_machine`` and ``by_model`` hold seconds per step of THIS job's workload (observed by
    its earlier attempts; a speed seen on another job must be rescaled by the ratio of the two
    jobs' reference speeds first). ``dlperf_by_model`` is the typical per-GPU DLPerf of each
    model; ``with_market`` fills it from the offers seen.
    """

    by_machine: Mapping[int, float] = field(default_factory=dict)
    by_model: Mapping[str, float] = field(default_factory=dict)
    dlperf_by_model: Mapping[str, float] = field(default_factory=dict)

    def with_market(self, offers: Iterable[Offer], num_gpus: int | None = None) -> SpeedBook:
        """A copy whose ``dlperf_by_model`` also has each model's median per-GPU DLPerf in
        ``offers`` (entries already present win).

        The median shrugs off the few slow machines whose DLPerf is pulled down. With
        ``num_gpus``, only offers of that size count where a model has some: per-GPU DLPerf
        falls as GPUs are added, and the reference speed was measured at the job's size.
        """
        sized: defaultdict[str, list[float]] = defaultdict(list)
        other: defaultdict[str, list[float]] = defaultdict(list)
        for offer in offers:
            per_gpu = _per_gpu_dlperf(offer)
            if per_gpu is not None and offer.gpu_name:
                same = num_gpus is None or offer.num_gpus == num_gpus
                (sized if same else other)[offer.gpu_name].append(per_gpu)
        models = sized.keys() | other.keys()
        medians = {m: statistics.median(sized.get(m) or other[m]) for m in models}
        return SpeedBook(self.by_machine, self.by_model, {**medians, **self.dlperf_by_model})


def _reference_dlperf(profile: JobProfile, speeds: SpeedBook) -> float | None:
    found = speeds.dlperf_by_model.get(profile.reference_gpu)
    return found or KNOWN_DLPERF_PER_GPU.get(profile.reference_gpu)


def seconds_per_step(
    offer: Offer, profile: JobProfile, speeds: SpeedBook
) -> tuple[float, str] | None:
    """Expected seconds per step on this offer and where the figure comes from.

    Machine observation beats model observation beats the DLPerf estimate
    ``reference s/step * reference DLPerf / offer DLPerf per GPU``. An offer without DLPerf is
    estimated from its model's typical DLPerf (``dlperf-model``); with neither, or with no
    DLPerf for the reference model, there is no estimate (None) and the offer is not ranked:
    guessing "as fast as the reference" would make every cheap old card look like a bargain.
    """
    if offer.machine_id is not None and offer.machine_id in speeds.by_machine:
        return speeds.by_machine[offer.machine_id], SPEED_MACHINE
    if offer.gpu_name in speeds.by_model:
        return speeds.by_model[offer.gpu_name], SPEED_MODEL
    reference = _reference_dlperf(profile, speeds)
    own = _per_gpu_dlperf(offer)
    typical = speeds.dlperf_by_model.get(offer.gpu_name)
    dlperf, source = (own, SPEED_DLPERF) if own else (typical, SPEED_DLPERF_MODEL)
    if not reference or not dlperf:
        return None
    return profile.reference_seconds_per_step * reference / dlperf, source


# --- Cost ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostBreakdown:
    """The expected cost of running the rest of the job on one offer (module docstring)."""

    offer_id: int
    seconds_per_step: float
    speed_source: str
    steps_remaining: int
    image_pull_h: float
    model_download_h: float
    container_start_h: float
    startup_h: float
    train_h: float
    gpu_billed_h: float  # start-up minus the image pull, plus training
    storage_billed_h: float  # start-up plus training
    download_gb: float
    upload_gb: float
    gpu_usd: float
    storage_usd: float
    download_usd: float
    upload_usd: float
    total_usd: float
    # The chance the machine still holds the job's image from an earlier rental (``ImageCache``):
    # the pull above is already (1 - this) x the whole pull.
    image_cached_chance: float = 0.0

    @property
    def wall_h(self) -> float:
        """Hours from rent to the last step."""
        return self.startup_h + self.train_h

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def transfer_hours(gb: float, mbps: float) -> float:
    """Hours to move ``gb`` GiB over a link of ``mbps`` Mbit/s."""
    return gb * BYTES_PER_GB * 8 / (mbps * BITS_PER_MBIT) / SECONDS_PER_HOUR


def startup_hours(
    profile: JobProfile, mbps: float, *, resuming: bool
) -> tuple[float, float, float]:
    """(image pull, downloads on the GPU's time, container start) in hours at MBPS: the
    profile's sizes at that bandwidth and its typed start, or what was measured (its
    ``start_s`` holds the command's downloads; a resume's checkpoint still comes at MBPS)."""
    restore_gb = profile.checkpoint_gb if resuming else 0.0
    if profile.start_s is None:
        fetch_h = transfer_hours(profile.model_gb + restore_gb, mbps)
        start_h = profile.container_start_s / SECONDS_PER_HOUR
    else:
        fetch_h = transfer_hours(restore_gb, mbps)
        start_h = profile.start_s / SECONDS_PER_HOUR
    if profile.pull_s is None:
        return transfer_hours(profile.image_gb, mbps), fetch_h, start_h
    return profile.pull_s / SECONDS_PER_HOUR, fetch_h, start_h


@dataclass(frozen=True)
class ImageCache:
    """The chance each machine still holds the job's image, pulled there by an earlier rental:
    ``BY_MACHINE`` maps a machine id to it (``jobs.image_cache.image_cached_odds`` decides it
    from the team's history); a machine not in it never pulled the image (chance 0).

    Only the image: Vast deletes an instance's disk with it (vast-ai/docs
    ``guides/instances/storage/types.mdx``), so a new instance never finds the model or a
    checkpoint there, whatever an earlier one downloaded. Image layers live in the host's
    Docker and outlast the instance (``hosts/sandbox/image_cache.py`` has the sources).
    """

    by_machine: Mapping[int, float] = field(default_factory=dict)
    words: Mapping[int, str] = field(default_factory=dict)  # where each chance came from

    def chance(self, machine_id: int | None) -> float:
        """The chance MACHINE_ID still holds the image (0 for one that never pulled it)."""
        if machine_id is None:
            return 0.0
        return min(max(float(self.by_machine.get(machine_id, 0.0)), 0.0), 1.0)


NO_IMAGE_CACHE = ImageCache()


def _billing_inputs(offer: Offer) -> tuple[float, float, float, float, float]:
    values = (
        offer.dph_base,
        offer.storage_usd_per_gb_hour,
        offer.download_usd_per_gb,
        offer.upload_usd_per_gb,
        offer.inet_down_mbps,
    )
    if any(v is None for v in values) or not offer.inet_down_mbps:
        raise CannotEstimate(f"offer {offer.id} lacks a price or its download bandwidth")
    return values  # type: ignore[return-value]


def estimate_cost(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    *,
    gpu_usd_per_hour: float | None = None,
    images: ImageCache = NO_IMAGE_CACHE,
) -> CostBreakdown:
    """Expected total cost of the rest of the job on ``offer`` (see the module docstring), with
    no interruption, at the offer's ``dph_base`` or at GPU_USD_PER_HOUR (a bid). On a machine
    that may still hold the image (IMAGES), the pull and its traffic are priced at (1 - that
    chance) of a whole pull: a host that kept the image starts the container at once.

    Raises ``CannotEstimate`` for an offer without prices, bandwidth or a speed estimate;
    ``filter_offers`` and ``rank_offers`` keep such offers out.
    """
    speed = seconds_per_step(offer, profile, speeds)
    if speed is None:
        raise CannotEstimate(f"offer {offer.id}: no speed estimate for {offer.gpu_name!r}")
    dph, storage, down_price, up_price, mbps = _billing_inputs(offer)
    if gpu_usd_per_hour is not None:
        dph = gpu_usd_per_hour
    fetched_gb = profile.model_gb + (profile.checkpoint_gb if profile.steps_done > 0 else 0.0)
    image_h, model_h, start_h = startup_hours(profile, mbps, resuming=profile.steps_done > 0)
    cached = images.chance(offer.machine_id)
    image_h *= 1.0 - cached
    train_h = profile.steps_remaining * speed[0] / SECONDS_PER_HOUR
    # Vast bills the GPU from `running` on: the image pull (`loading`) is not GPU time (ref §7).
    gpu_h = model_h + start_h + train_h
    down_gb = profile.image_gb * (1.0 - cached) + fetched_gb
    up_gb = profile.upload_gb * profile.share_remaining
    usd = {
        "gpu_usd": dph * gpu_h,
        "storage_usd": storage * req.disk_gb * (image_h + gpu_h),
        "download_usd": down_gb * down_price,
        "upload_usd": up_gb * up_price,
    }
    return CostBreakdown(
        offer_id=offer.id,
        seconds_per_step=speed[0],
        speed_source=speed[1],
        steps_remaining=profile.steps_remaining,
        image_pull_h=image_h,
        model_download_h=model_h,
        container_start_h=start_h,
        startup_h=image_h + model_h + start_h,
        train_h=train_h,
        gpu_billed_h=gpu_h,
        storage_billed_h=image_h + gpu_h,
        download_gb=down_gb,
        upload_gb=up_gb,
        **usd,
        total_usd=sum(usd.values()),
        image_cached_chance=cached,
    )


# --- Rental type and preemption -------------------------------------------------------------

ON_DEMAND, INTERRUPTIBLE, AUTO = "on-demand", "interruptible", "auto"
RENTALS = (ON_DEMAND, INTERRUPTIBLE, AUTO)
# The margins over min_bid the model weighs (a bid is min_bid x (1 + margin)).
BID_MARGINS = (0.0, 0.05, 0.15, 0.3, 0.5, 1.0)

# The prior, until the team's own history says otherwise (``PreemptionRates``). A host is lost
# (offline, vanished, rebooted for good) about once in 50 rented hours: the field report's
# community hosts at reliability ~0.98-0.99. A bid at min_bid is outbid about every two hours
# on a popular GPU (Vast has no notice and no minimum run; the FAQ's "50-80 % cheaper" is paid
# for with that), and each margin of 0.25 over min_bid cuts the rate by e.
PRIOR_HOST_LOSS_PER_H = 0.02
PRIOR_OUTBID_PER_H = 0.5
PRIOR_OUTBID_MARGIN_SCALE = 0.25
# How many rented hours the prior weighs against what was observed.
PRIOR_WEIGHT_H = 10.0
# What a recovery takes besides starting again: noticing the loss and renting a replacement
# (field report: ~30 s to detect, seconds to rent).
DETECTION_S = 30.0
RENT_S = 20.0
NOT_BIDDABLE = "not_biddable"


def prior_rate(kind: str, margin: float = 0.0) -> float:
    """Interruptions per rented hour before any history: host loss, plus outbids for a bid."""
    if kind != INTERRUPTIBLE:
        return PRIOR_HOST_LOSS_PER_H
    return PRIOR_HOST_LOSS_PER_H + PRIOR_OUTBID_PER_H * math.exp(
        -margin / PRIOR_OUTBID_MARGIN_SCALE
    )


def margin_bucket(margin: float) -> float:
    """The ``BID_MARGINS`` entry nearest MARGIN (history is counted by these)."""
    return min(BID_MARGINS, key=lambda m: abs(m - margin))


def history_words(seen: int, hours: float) -> str:
    """Where a blended λ came from, as the job page says it: "the team's 1 interruption in
    36 min rented, weighed with a 10 h prior". Under an hour reads in minutes (a tenth of an
    hour rounded to "0.0 h" read as if nothing was rented)."""
    minutes = hours * 60
    rented = (
        f"{hours:.1f} h"
        if hours >= 1
        else f"{round(minutes)} min"
        if minutes >= 1
        else "under a minute"
    )
    what = "interruption" if seen == 1 else "interruptions"
    return f"the team's {seen} {what} in {rented} rented, weighed with a {PRIOR_WEIGHT_H:g} h prior"


@dataclass(frozen=True)
class PreemptionRates:
    """Interruptions and rented hours seen, by (rental type, GPU model, margin bucket); what is
    not seen falls back to ``prior_rate``, and what is seen is blended with it (the prior as
    ``PRIOR_WEIGHT_H`` hours at its own rate)."""

    observed: Mapping[tuple[str, str, float], tuple[int, float]] = field(default_factory=dict)

    def rate(self, kind: str, gpu_name: str, margin: float = 0.0) -> tuple[float, str]:
        """(λ per hour, where it came from) for a rental of KIND on GPU_NAME at MARGIN."""
        bucket = margin_bucket(margin) if kind == INTERRUPTIBLE else 0.0
        prior = prior_rate(kind, margin)
        seen, hours = self.observed.get((kind, gpu_name, bucket), (0, 0.0))
        if hours <= 0:
            return prior, "prior"
        blended = (seen + prior * PRIOR_WEIGHT_H) / (hours + PRIOR_WEIGHT_H)
        return blended, history_words(seen, hours)


@dataclass(frozen=True)
class Rental:
    """On-demand at ``dph_base``, or interruptible: a bid of ``min_bid`` x (1 + BID_MARGIN)."""

    kind: str = ON_DEMAND
    bid_margin: float = 0.0

    def gpu_usd_per_hour(self, offer: Offer) -> float | None:
        """What the GPU costs per hour rented this way; None when the offer takes no bid."""
        if self.kind == ON_DEMAND:
            return offer.dph_base
        if not offer.min_bid or offer.min_bid <= 0:
            return None
        return round(max(offer.min_bid * (1 + self.bid_margin), BID_MIN_USD), 4)

    @property
    def label(self) -> str:
        """ "on-demand" or "interruptible, min_bid +15 %"."""
        if self.kind == ON_DEMAND:
            return ON_DEMAND
        return f"interruptible, min_bid +{self.bid_margin:.0%}"


@dataclass(frozen=True)
class RentalCost:
    """The expected total of one way of renting one offer, interruptions included."""

    rental: Rental
    gpu_usd_per_hour: float
    base: CostBreakdown  # the run with no interruption, at this GPU price
    preemptions_per_h: float
    rate_source: str
    expected_preemptions: float
    rework_h: float  # wall hours one interruption costs
    rework_usd: float  # dollars one interruption costs
    redo_h: float  # of which training done again (half a checkpoint interval)
    expected_total_usd: float
    expected_wall_h: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, without the base breakdown (stored beside it)."""
        data = asdict(self)
        del data["base"]
        data["rental"] = {**asdict(self.rental), "label": self.rental.label}
        # JSON (and PostgreSQL's jsonb) has no infinity: "never finishes" is stored as null.
        return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in data.items()}


UNKNOWN_INTERVAL_MAX_H = 1.0


def checkpoint_interval_h(profile: JobProfile, seconds_per_step: float) -> float:
    """Hours between two checkpoints: the job's own, else a tenth of the run but at most
    ``UNKNOWN_INTERVAL_MAX_H`` (scripts that do not say rarely go hours without saving)."""
    if profile.checkpoint_every_steps:
        return profile.checkpoint_every_steps * seconds_per_step / SECONDS_PER_HOUR
    tenth = max(profile.steps_total // 10, 1) * seconds_per_step / SECONDS_PER_HOUR
    return min(tenth, UNKNOWN_INTERVAL_MAX_H)


def expected_cost(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    rental: Rental,
    rates: PreemptionRates,
    images: ImageCache = NO_IMAGE_CACHE,
) -> RentalCost | None:
    """Expected total cost of the rest of the job on OFFER rented as RENTAL: the run itself
    plus λ x expected hours interruptions, each costing detection, a new rent, the start-up
    again and half a checkpoint interval of training (module docstring). None when the offer
    takes no such bid; an infinite total when interruptions come faster than the work. IMAGES
    prices this run's pull; a recovery's pull is whole (the replacement is another machine)."""
    price = rental.gpu_usd_per_hour(offer)
    if price is None:
        return None
    base = estimate_cost(offer, profile, speeds, req, gpu_usd_per_hour=price, images=images)
    lam, source = rates.rate(rental.kind, offer.gpu_name or "", rental.bid_margin)
    _, storage, down_price, _, mbps = _billing_inputs(offer)
    # A resume downloads the checkpoint too, whether or not this run started from one.
    again_gb = profile.image_gb + profile.model_gb + profile.checkpoint_gb
    image_h, fetch_h, start_h = startup_hours(profile, mbps, resuming=True)
    redo_h = checkpoint_interval_h(profile, base.seconds_per_step) / 2
    wait_h = (DETECTION_S + RENT_S) / SECONDS_PER_HOUR
    rework_h = wait_h + image_h + fetch_h + start_h + redo_h
    gpu_h = fetch_h + start_h + redo_h  # the pull is not GPU time; waiting bills nothing
    rework_usd = price * gpu_h + storage * req.disk_gb * (image_h + gpu_h) + again_gb * down_price
    if lam * rework_h >= 1.0:
        preemptions, wall_h, total = math.inf, math.inf, math.inf
    else:
        # Interruptions during the rework count too: N = λ (W + N r) solved for N.
        preemptions = lam * base.wall_h / (1.0 - lam * rework_h)
        wall_h = base.wall_h + preemptions * rework_h
        total = base.total_usd + preemptions * rework_usd
    return RentalCost(
        rental=rental,
        gpu_usd_per_hour=price,
        base=base,
        preemptions_per_h=lam,
        rate_source=source,
        expected_preemptions=preemptions,
        rework_h=rework_h,
        rework_usd=rework_usd,
        redo_h=redo_h,
        expected_total_usd=total,
        expected_wall_h=wall_h,
    )


def rentals_to_weigh(offer: Offer, req: Requirements) -> list[Rental]:
    """The ways REQ allows OFFER to be rented: on-demand, and bids at each margin that stay
    under ``max_bid_dph`` and Vast's range (and, for ``auto``, under the on-demand price)."""
    found = [] if req.rental == INTERRUPTIBLE else [Rental(ON_DEMAND)]
    if req.rental == ON_DEMAND or not offer.min_bid:
        return found
    cap = min(req.max_bid_dph or BID_MAX_USD, BID_MAX_USD)
    for margin in req.bid_margins or BID_MARGINS:
        price = Rental(INTERRUPTIBLE, margin).gpu_usd_per_hour(offer)
        if price is None or price > cap:
            continue
        if req.rental == AUTO and offer.dph_base is not None and price >= offer.dph_base:
            continue  # paying on-demand's price for an interruptible machine never pays
        found.append(Rental(INTERRUPTIBLE, margin))
    return found


def best_rental(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    rates: PreemptionRates,
    images: ImageCache = NO_IMAGE_CACHE,
) -> RentalCost | None:
    """The cheapest expected way to rent OFFER under REQ, or None when REQ allows none."""
    costs = [
        cost
        for rental in rentals_to_weigh(offer, req)
        if (cost := expected_cost(offer, profile, speeds, req, rental, rates, images)) is not None
    ]
    # Interruptions faster than the work give an infinite total: such a way ranks last, but
    # an offer whose every way is infinite (a run of thousands of hours) is still an offer.
    return min(costs, key=lambda c: (c.expected_total_usd, c.rental.bid_margin), default=None)


@dataclass(frozen=True)
class OutbidChoice:
    """After an outbid: raise the bid and wait for the same machine (RAISE_TO), or move."""

    raise_to: float | None
    stay_usd: float
    move_usd: float

    @property
    def why(self) -> str:
        """One line for the job's timeline."""
        # Staying restarts the same instance, whose disk Vast keeps: the one place where the
        # model is on disk (a new instance's disk starts empty; ``ImageCache``).
        verb = (
            f"raise the bid to ${self.raise_to:.4f}/h (the same instance: image cached, "
            "model on disk)"
            if self.raise_to
            else "move"
        )
        return f"{verb}: staying ${self.stay_usd:.3f} vs moving ${self.move_usd:.3f} expected"


# A raise bids this much over the new floor: a bid equal to the winning one is not assumed to
# take the machine back (Vast documents no tie rule).
RAISE_STEP_USD = 0.001


def outbid_choice(
    *,
    steps_left: int,
    stay_seconds_per_step: float,
    new_min_bid: float | None,
    bid_margin: float,
    stay_outbids_per_h: float,
    restart_h: float,
    cap_usd_per_hour: float | None,
    move_usd_per_hour: float,
    move_seconds_per_step: float,
    move_interruptions_per_h: float,
    move_rework_usd: float,
) -> OutbidChoice:
    """Whether an outbid job should raise its bid and wait for its machine, or move.

    Both are priced from the newest checkpoint (STEPS_LEFT; the work lost is the same either
    way). Staying pays the new bid (NEW_MIN_BID plus the job's margin and ``RAISE_STEP_USD``)
    for the steps left at this machine's speed and a restart in the same container
    (RESTART_H: the image and model are on its disk already), plus the restarts its
    STAY_OUTBIDS_PER_H still expect. Moving pays the best other candidate's price at its own
    speed, a whole start-up (MOVE_REWORK_USD) and the rework of its own expected
    interruptions. A bid at or over CAP_USD_PER_HOUR (the job's max bid, and the machine's
    on-demand price: paying that for an interruptible machine never pays) or out of Vast's
    range is never placed.
    """
    move_h = steps_left * move_seconds_per_step / SECONDS_PER_HOUR
    move = move_usd_per_hour * move_h + move_rework_usd * (1 + move_interruptions_per_h * move_h)
    if not new_min_bid or new_min_bid <= 0:
        return OutbidChoice(None, math.inf, move)
    price = round(max(new_min_bid * (1 + bid_margin), BID_MIN_USD) + RAISE_STEP_USD, 4)
    stay_h = steps_left * stay_seconds_per_step / SECONDS_PER_HOUR
    restarts = 1 + stay_outbids_per_h * stay_h
    stay = price * (stay_h + restarts * restart_h)
    cap = min(cap_usd_per_hour or CHANGE_BID_MAX_USD, CHANGE_BID_MAX_USD)
    if price >= cap or stay >= move:
        return OutbidChoice(None, stay, move)
    return OutbidChoice(price, stay, move)


# --- Ranking and the decision -----------------------------------------------------------------


@dataclass(frozen=True)
class Ranked:
    """One acceptable offer, the best way to rent it, and its expected cost: COST is the run
    without interruptions at that rental's price, RENTAL the expected total with them."""

    offer: Offer
    cost: CostBreakdown
    rental: RentalCost

    @property
    def expected_total_usd(self) -> float:
        """What the ranking compares."""
        return self.rental.expected_total_usd

    def as_dict(self, req: Requirements) -> dict[str, Any]:
        """JSON-ready: the offer's deciding fields, the cost breakdown, the rental."""
        return {
            "offer": offer_summary(self.offer, req),
            "cost": self.cost.as_dict(),
            "rental": self.rental.as_dict(),
        }


def offer_summary(offer: Offer, req: Requirements) -> dict[str, Any]:
    """The fields of an offer that the decision rested on, as plain JSON data."""
    return {
        "id": offer.id,
        "machine_id": offer.machine_id,
        "host_id": offer.host_id,
        "gpu_name": offer.gpu_name,
        "num_gpus": offer.num_gpus,
        "dph_base": offer.dph_base,
        "dph_total": job_dph_total(offer, req.disk_gb),
        "storage_usd_per_gb_hour": offer.storage_usd_per_gb_hour,
        "download_usd_per_gb": offer.download_usd_per_gb,
        "upload_usd_per_gb": offer.upload_usd_per_gb,
        "inet_down_mbps": offer.inet_down_mbps,
        "inet_up_mbps": offer.inet_up_mbps,  # the adaptive interval's δ before an upload
        "reliability": offer.reliability,
        "dlperf": offer.dlperf,
        "verified": offer.verified,
        "datacenter": offer.datacenter,
        "geolocation": offer.geolocation,
    }


def _ranking_key(item: Ranked) -> tuple[float, float, int]:
    # Cheapest first; at equal cost the more reliable host; then the id, so ties are stable.
    return item.expected_total_usd, -(item.offer.reliability or 0.0), item.offer.id


def _rank_with_rejections(
    offers: Sequence[Offer],
    req: Requirements,
    profile: JobProfile,
    speeds: SpeedBook | None,
    rates: PreemptionRates | None = None,
    images: ImageCache = NO_IMAGE_CACHE,
) -> tuple[list[Ranked], list[Rejection]]:
    book = (speeds or SpeedBook()).with_market(offers, req.num_gpus)
    rates = rates or PreemptionRates()
    kept, rejected = filter_offers(offers, req)
    ranked: list[Ranked] = []
    for offer in kept:
        if seconds_per_step(offer, profile, book) is None:
            detail = f"no observed speed and no DLPerf for {offer.gpu_name or 'unknown GPU'}"
            rejected.append(Rejection(offer.id, offer.machine_id, RULE_UNKNOWN_SPEED, detail))
            continue
        rental = best_rental(offer, profile, book, req, rates, images)
        if rental is None:
            detail = "takes no bid (no min_bid), or none under max_bid_dph"
            rejected.append(Rejection(offer.id, offer.machine_id, NOT_BIDDABLE, detail))
            continue
        if (short := contract_too_short(offer, rental.base)) is not None:
            rejected.append(Rejection(offer.id, offer.machine_id, RULE_CONTRACT, short))
            continue
        ranked.append(Ranked(offer, rental.base, rental))
    return sorted(ranked, key=_ranking_key), rejected


def rank_offers(
    offers: Sequence[Offer],
    req: Requirements,
    profile: JobProfile,
    speeds: SpeedBook | None = None,
    rates: PreemptionRates | None = None,
    *,
    images: ImageCache = NO_IMAGE_CACHE,
) -> list[Ranked]:
    """Offers meeting ``req``, cheapest expected total cost of the job first, each rented the
    cheapest way ``req.rental`` allows (RATES: the team's interruption history; IMAGES: the
    machines that may still hold the job's image).

    DLPerf estimates are calibrated on all of ``offers`` (``SpeedBook.with_market``), so pass
    the whole search result, not a pre-filtered slice.
    """
    return _rank_with_rejections(offers, req, profile, speeds, rates, images)[0]


@dataclass(frozen=True)
class Decision:
    """The offer to rent, the runners-up and what was turned away, for the attempt's record."""

    chosen: Ranked
    candidates: tuple[Ranked, ...]  # the best few, chosen first
    offers_seen: int
    offers_ranked: int
    rejected_by_rule: Mapping[str, int]
    requirements: Requirements
    profile: JobProfile
    alternatives: tuple[dict[str, Any], ...] = ()  # the chosen offer's other ways to rent

    @property
    def chosen_offer_id(self) -> int:
        """The ask id to rent."""
        return self.chosen.offer.id

    @property
    def bid_usd_per_hour(self) -> float | None:
        """The bid to place, or None for an on-demand rental."""
        chosen = self.chosen.rental
        return chosen.gpu_usd_per_hour if chosen.rental.kind == INTERRUPTIBLE else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, to store on the attempt and show on the job page."""
        req = self.requirements
        total = self.chosen.expected_total_usd
        return {
            "chosen_offer_id": self.chosen_offer_id,
            "estimated_total_usd": total if math.isfinite(total) else None,
            "rental": self.chosen.rental.as_dict(),
            "alternatives": self.alternatives,
            "chosen": self.chosen.as_dict(req),
            "candidates": [c.as_dict(req) for c in self.candidates],
            "offers_seen": self.offers_seen,
            "offers_ranked": self.offers_ranked,
            "offers_rejected": sum(self.rejected_by_rule.values()),
            "rejected_by_rule": dict(self.rejected_by_rule),
            "requirements": req.as_dict(),
            "profile": self.profile.as_dict(),
        }


def choose_offer(
    offers: Sequence[Offer],
    req: Requirements,
    profile: JobProfile,
    speeds: SpeedBook | None = None,
    *,
    rates: PreemptionRates | None = None,
    top_n: int = DEFAULT_TOP_N,
    images: ImageCache = NO_IMAGE_CACHE,
) -> Decision | None:
    """The offer with the lowest expected total cost of the job, rented the cheapest way
    ``req.rental`` allows, or None when none qualifies. The decision keeps the chosen offer's
    other rentals (on-demand, the other bid margins) with their expected totals."""
    ranked, rejected = _rank_with_rejections(offers, req, profile, speeds, rates, images)
    if not ranked:
        return None
    by_rule = Counter(r.rule for r in rejected)
    book = (speeds or SpeedBook()).with_market(offers, req.num_gpus)
    chosen = ranked[0]
    alternatives = tuple(
        cost.as_dict()
        for rental in rentals_to_weigh(chosen.offer, req)
        if rental != chosen.rental.rental
        and (
            cost := expected_cost(
                chosen.offer, profile, book, req, rental, rates or PreemptionRates(), images
            )
        )
        is not None
    )
    return Decision(
        alternatives=alternatives,
        chosen=ranked[0],
        candidates=tuple(ranked[: max(top_n, 1)]),
        offers_seen=len(offers),
        offers_ranked=len(ranked),
        rejected_by_rule=dict(sorted(by_rule.items())),
        requirements=req,
        profile=profile,
    )
