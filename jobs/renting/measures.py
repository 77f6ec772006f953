"""The figures the team's earlier runs of a job's shape measured, as plain values (``History``:
speeds, downloads, start-up, checkpoints, the host paid), each with the number of runs it
came from, and the pure readers that turn stored rows into them (``shape_history`` runs the
queries).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from hosts import selection

GB = 1024**3  # the unit the cost model prices traffic in (hosts.selection.BYTES_PER_GB)


@dataclass(frozen=True)
class Measure:
    """One measured figure and the number of runs (jobs) it came from."""

    value: float
    runs: int


@dataclass(frozen=True)
class Speeds:
    """Seconds per step the shape showed, by machine and by GPU model (medians), the per-GPU
    DLPerf of the offers those runs rented (by model), and how many runs measured any."""

    by_machine: Mapping[int, float] = field(default_factory=dict)
    by_model: Mapping[str, float] = field(default_factory=dict)
    dlperf_by_model: Mapping[str, float] = field(default_factory=dict)
    runs: int = 0
    seen: Mapping[str, int] = field(default_factory=dict)  # observations per model
    # The GPU counts these were measured at when no run measured the job's own count: scaled
    # to it (``selection.seconds_per_step_at``), so "estimated from 1-GPU runs", not measured.
    # Empty: measured at the job's own count (or nothing measured).
    estimated_from: tuple[int, ...] = ()

    @property
    def source_words(self) -> str:
        """ "estimated from 1-GPU runs" (or "1- and 2-GPU") when scaled from another count,
        else ""."""
        if not self.estimated_from:
            return ""
        *first, last = self.estimated_from
        counts = f"{', '.join(f'{n}-' for n in first)} and {last}-" if first else f"{last}-"
        return f"estimated from {counts}GPU runs"

    def reference(self, gpu: str) -> float | None:
        """Seconds per step on one GPU model: measured on it, else the most measured model's
        scaled by their per-GPU DLPerf (the selection's own scaling); None without either."""
        if gpu in self.by_model:
            return self.by_model[gpu]
        target = self.dlperf_by_model.get(gpu) or selection.KNOWN_DLPERF_PER_GPU.get(gpu)
        for model, _ in Counter(self.seen).most_common():
            if target and (own := self.dlperf_by_model.get(model)):
                return self.by_model[model] * own / target
        return None

    def book(self) -> selection.SpeedBook:
        """The selection's book of these speeds (``with_market`` adds the market's DLPerf)."""
        return selection.SpeedBook(
            by_machine=dict(self.by_machine),
            by_model=dict(self.by_model),
            dlperf_by_model=dict(self.dlperf_by_model),
        )


@dataclass(frozen=True)
class Startup:
    """Seconds from rent to container up (``pull_s``: storage only, as Vast's ``loading``;
    None when every run found the image on its machine, so none measured a whole pull) and
    GPU-billed seconds besides the steps and a resume's restore (``start_s``)."""

    pull_s: float | None
    start_s: float
    runs: int


@dataclass(frozen=True)
class Checkpoints:
    """The shape's checkpoints: median size, bytes uploaded per step trained, upload time."""

    size_gb: float
    upload_gb_per_step: float
    upload_s: float | None
    runs: int


@dataclass(frozen=True)
class HostPaid:
    """The host the shape's rents got: its most rented GPU model and the median rates paid
    (the GPU's being the bid for an interruptible rental)."""

    gpu_name: str
    dph: float
    storage_usd_per_gb_hour: float
    download_usd_per_gb: float
    upload_usd_per_gb: float
    runs: int


@dataclass(frozen=True)
class History:
    """Everything measured on a shape's earlier runs; a figure never measured is None."""

    speeds: Speeds = field(default_factory=Speeds)
    download: Measure | None = None
    startup: Startup | None = None
    checkpoints: Checkpoints | None = None
    host: HostPaid | None = None
    # The newest stored rent decision that ranked offers (``selection.Decision.as_dict``).
    last_decision: Mapping = field(default_factory=dict)


NO_HISTORY = History()


def scaled_speeds(rows: Iterable[tuple[tuple, int | None]], num_gpus: int) -> Speeds:
    """``Speeds`` at NUM_GPUS of (speed row, GPU count it was measured at) pairs measured at
    other counts, each s/step scaled by ``selection.seconds_per_step_at``."""
    scaled, counts = [], set()
    for row, gpus in rows:
        if not gpus or not row[3] or row[3] <= 0:
            continue
        spp = selection.seconds_per_step_at(row[3], measured_gpus=gpus, num_gpus=num_gpus)
        scaled.append((*row[:3], spp, *row[4:]))
        counts.add(gpus)
    found = speeds_from(scaled)
    return replace(found, estimated_from=tuple(sorted(counts))) if found.runs else found


def gpu_count_of(value: object) -> int | None:
    """A stored GPU count, or None where none (or no sane one) was stored."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def speeds_from(rows: Iterable[tuple]) -> Speeds:
    """``Speeds`` of (job, machine, GPU model, s/step, offer DLPerf, offer GPUs) rows."""
    machines, models, dlperf = defaultdict(list), defaultdict(list), defaultdict(list)
    jobs = set()
    for job_id, machine, gpu, spp, offer_dlperf, gpus in rows:
        if not spp or spp <= 0:
            continue
        jobs.add(job_id)
        if machine is not None:
            machines[machine].append(spp)
        if gpu:
            models[gpu].append(spp)
            if isinstance(offer_dlperf, int | float) and offer_dlperf > 0 and gpus:
                dlperf[gpu].append(offer_dlperf / gpus)
    return Speeds(
        by_machine=_medians(machines),
        by_model=_medians(models),
        dlperf_by_model=_medians(dlperf),
        runs=len(jobs),
        seen={model: len(values) for model, values in models.items()},
    )


START_FIELDS = (
    "job_id",
    "rented_at",
    "registered_at",
    "container_started_at",
    "deps_ready_at",
    "workdir_ready_at",
    "setup_done_at",
    "restore_unpacked_at",
    "ended_at",
    "step",
    "resumed_from_step",
    "seconds_per_step",
)


def start_seconds(row: Mapping) -> tuple[float, float]:
    """(pull, start) seconds of one finished attempt (a row of ``START_FIELDS``).

    The pull runs from the rent to the container's start (the bootstrap's first report, else
    the agent's first call). The GPU bills from that start to the destroy, which follows the
    attempt's end: what of it the steps trained here (at the attempt's s/step) and a resume's
    restore (priced apart, at the next host's bandwidth) do not explain is the start."""
    up = _clip(row["container_started_at"] or row["registered_at"], row["rented_at"])
    pull = _seconds(row["rented_at"], up)
    trained = max((row["step"] or 0) - (row["resumed_from_step"] or 0), 0)
    billed = _seconds(up, row["ended_at"])
    start = billed - trained * row["seconds_per_step"] - restore_seconds(row)
    return pull, max(start, 0.0)


def restore_seconds(row: Mapping) -> float:
    """Seconds a resume spent fetching and unpacking its checkpoint: from the last phase
    before it (setup, code, dependencies, container) to unpacked; 0 without a restore."""
    if row["restore_unpacked_at"] is None:
        return 0.0
    before = ("setup_done_at", "workdir_ready_at", "deps_ready_at", "container_started_at")
    since = next((row[name] for name in before if row[name] is not None), None)
    return _seconds(since, row["restore_unpacked_at"]) if since else 0.0


def checkpoints_from(rows: Iterable[tuple]) -> Checkpoints | None:
    """``Checkpoints`` of (job, size, step, announced, ready) rows; None without any."""
    sizes, uploads = [], []
    per_job: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for job_id, size, step, created, ready in rows:
        sizes.append(size / GB)
        per_job[job_id][0] += size
        per_job[job_id][1] = max(per_job[job_id][1], step)
        if ready is not None and ready >= created:
            uploads.append((ready - created).total_seconds())
    per_step = [total / GB / last for total, last in per_job.values() if last > 0]
    if not sizes or not per_step:
        return None
    return Checkpoints(
        size_gb=statistics.median(sizes),
        upload_gb_per_step=statistics.median(per_step),
        upload_s=statistics.median(uploads) if uploads else None,
        runs=len(per_job),
    )


def median_measure(found: list[tuple[int, float]]) -> Measure | None:
    """The median of FOUND's (job, value) pairs, counted in jobs; None for none."""
    if not found:
        return None
    return Measure(statistics.median(v for _, v in found), len({job for job, _ in found}))


def _medians(values: Mapping) -> dict:
    return {key: statistics.median(found) for key, found in values.items()}


def _seconds(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return max((end - start).total_seconds(), 0.0)


def _clip(moment: datetime | None, earliest: datetime) -> datetime:
    # The bootstrap reports its start in whole seconds: it can read as before the rent.
    return earliest if moment is None or moment < earliest else moment
