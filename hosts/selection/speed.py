"""How fast the job trains on an offer: seconds per step, observed or estimated from DLPerf."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hosts.selection.profile import JobProfile
from hosts.vast import Offer

# Per-GPU DLPerf of a healthy card, used only when the offers at hand hold none of the
# reference model. RTX 4090: about 100 (a real Vast offer of one RTX 4090 showed a DLPerf of
# 106.6; the sandbox market's offers.json takes 100 as the RTX 4090's base).
KNOWN_DLPERF_PER_GPU: Mapping[str, float] = {"RTX 4090": 100.0}

# Speed sources, best first: observed on this machine, observed on this GPU model, estimated
# from the offer's DLPerf, estimated from its model's typical DLPerf (the offer has none).
SPEED_MACHINE, SPEED_MODEL, SPEED_DLPERF, SPEED_DLPERF_MODEL = (
    "machine",
    "model",
    "dlperf",
    "dlperf-model",
)


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
    model; ``with_market`` fills it from the offers seen. ``machine_factors`` holds, for the
    machines the team's memory knows (``machine_memory.speed_factor``, across all its jobs),
    the s/step each showed over what was promised: ``estimate_cost`` scales every estimate but
    a machine's own measurement of this job by it.
    """

    by_machine: Mapping[int, float] = field(default_factory=dict)
    by_model: Mapping[str, float] = field(default_factory=dict)
    dlperf_by_model: Mapping[str, float] = field(default_factory=dict)
    machine_factors: Mapping[int, float] = field(default_factory=dict)

    def machine_factor(self, machine_id: int | None, source: str) -> float:
        """The factor an estimate from SOURCE on MACHINE_ID is scaled by (1 for a speed this
        job measured on that machine: it is the machine's own already)."""
        if machine_id is None or source == SPEED_MACHINE:
            return 1.0
        return float(self.machine_factors.get(machine_id, 1.0))

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
        return SpeedBook(
            self.by_machine,
            self.by_model,
            {**medians, **self.dlperf_by_model},
            self.machine_factors,
        )


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
