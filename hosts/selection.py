"""Offer selection: which Vast offer to rent for a job, by the expected TOTAL cost of the job.

Plain data in, plain data out (``hosts.vast.Offer`` and the dataclasses below); no Django, no
network, so it runs the same on a live search, the sandbox and a market file.

The cost model (``estimate_cost``), in the units of ``hosts.vast`` (GB = GiB = 1024³ bytes, the
unit traffic is priced in; bandwidth in Mbit/s; prices per hour / per GB / per GB-hour):

=================  ============================================================================
start-up           ``image_pull_h``     image size / inet_down (Vast state ``loading``)
                   ``model_download_h`` model (+ checkpoint when resuming) / inet_down
                   ``container_start_h`` fixed overhead (``JobProfile.container_start_s``)
training           ``train_h``          (steps_total - steps_done) * seconds per step
GPU                ``dph_base`` * (model download + container start + training)
storage            storage $/GB/h * ``Requirements.disk_gb`` * (start-up + training)
traffic            (image + model [+ checkpoint]) GB * download $/GB
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

Not modelled: checkpoint uploads overlap training (they cost traffic, not time); a host's link
is assumed to deliver its advertised ``inet_down``; the chance that the host is lost midway
(``min_reliability`` filters out the risky ones instead of pricing the risk).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hosts.vast import MIB_PER_GIB, Offer

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

    def __post_init__(self) -> None:
        # Accept what JSON gives (lists, "RTX_4090") and keep the frozen object hashable.
        object.__setattr__(self, "gpu_names", tuple(_gpu_name(n) for n in self.gpu_names))
        avoid = frozenset(int(m) for m in self.avoid_machine_ids)
        object.__setattr__(self, "avoid_machine_ids", avoid)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples and sets become sorted lists."""
        data = asdict(self)
        data["gpu_names"] = list(self.gpu_names)
        data["avoid_machine_ids"] = sorted(self.avoid_machine_ids)
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
    offer: Offer, profile: JobProfile, speeds: SpeedBook, req: Requirements
) -> CostBreakdown:
    """Expected total cost of the rest of the job on ``offer`` (see the module docstring).

    Raises ``CannotEstimate`` for an offer without prices, bandwidth or a speed estimate;
    ``filter_offers`` and ``rank_offers`` keep such offers out.
    """
    speed = seconds_per_step(offer, profile, speeds)
    if speed is None:
        raise CannotEstimate(f"offer {offer.id}: no speed estimate for {offer.gpu_name!r}")
    dph, storage, down_price, up_price, mbps = _billing_inputs(offer)
    fetched_gb = profile.model_gb + (profile.checkpoint_gb if profile.steps_done > 0 else 0.0)
    image_h, model_h = transfer_hours(profile.image_gb, mbps), transfer_hours(fetched_gb, mbps)
    start_h = profile.container_start_s / SECONDS_PER_HOUR
    train_h = profile.steps_remaining * speed[0] / SECONDS_PER_HOUR
    # Vast bills the GPU from `running` on: the image pull (`loading`) is not GPU time (ref §7).
    gpu_h = model_h + start_h + train_h
    down_gb = profile.image_gb + fetched_gb
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
    )


# --- Ranking and the decision -----------------------------------------------------------------


@dataclass(frozen=True)
class Ranked:
    """One acceptable offer with its expected cost."""

    offer: Offer
    cost: CostBreakdown

    def as_dict(self, req: Requirements) -> dict[str, Any]:
        """JSON-ready: the offer's deciding fields, then the cost breakdown."""
        return {"offer": offer_summary(self.offer, req), "cost": self.cost.as_dict()}


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
        "reliability": offer.reliability,
        "dlperf": offer.dlperf,
        "verified": offer.verified,
        "datacenter": offer.datacenter,
        "geolocation": offer.geolocation,
    }


def _ranking_key(item: Ranked) -> tuple[float, float, int]:
    # Cheapest first; at equal cost the more reliable host; then the id, so ties are stable.
    return item.cost.total_usd, -(item.offer.reliability or 0.0), item.offer.id


def _rank_with_rejections(
    offers: Sequence[Offer], req: Requirements, profile: JobProfile, speeds: SpeedBook | None
) -> tuple[list[Ranked], list[Rejection]]:
    book = (speeds or SpeedBook()).with_market(offers, req.num_gpus)
    kept, rejected = filter_offers(offers, req)
    ranked: list[Ranked] = []
    for offer in kept:
        if seconds_per_step(offer, profile, book) is None:
            detail = f"no observed speed and no DLPerf for {offer.gpu_name or 'unknown GPU'}"
            rejected.append(Rejection(offer.id, offer.machine_id, RULE_UNKNOWN_SPEED, detail))
            continue
        cost = estimate_cost(offer, profile, book, req)
        if (short := contract_too_short(offer, cost)) is not None:
            rejected.append(Rejection(offer.id, offer.machine_id, RULE_CONTRACT, short))
            continue
        ranked.append(Ranked(offer, cost))
    return sorted(ranked, key=_ranking_key), rejected


def rank_offers(
    offers: Sequence[Offer],
    req: Requirements,
    profile: JobProfile,
    speeds: SpeedBook | None = None,
) -> list[Ranked]:
    """Offers meeting ``req``, cheapest expected total cost of the job first.

    DLPerf estimates are calibrated on all of ``offers`` (``SpeedBook.with_market``), so pass
    the whole search result, not a pre-filtered slice.
    """
    return _rank_with_rejections(offers, req, profile, speeds)[0]


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

    @property
    def chosen_offer_id(self) -> int:
        """The ask id to rent."""
        return self.chosen.offer.id

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, to store on the attempt and show on the job page."""
        req = self.requirements
        return {
            "chosen_offer_id": self.chosen_offer_id,
            "estimated_total_usd": self.chosen.cost.total_usd,
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
    top_n: int = DEFAULT_TOP_N,
) -> Decision | None:
    """The offer with the lowest expected total cost of the job, or None when none qualifies."""
    ranked, rejected = _rank_with_rejections(offers, req, profile, speeds)
    if not ranked:
        return None
    by_rule = Counter(r.rule for r in rejected)
    return Decision(
        chosen=ranked[0],
        candidates=tuple(ranked[: max(top_n, 1)]),
        offers_seen=len(offers),
        offers_ranked=len(ranked),
        rejected_by_rule=dict(sorted(by_rule.items())),
        requirements=req,
        profile=profile,
    )
