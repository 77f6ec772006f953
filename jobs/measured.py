"""What the team measured on earlier runs of a job's shape, and the profile it corrects.

A job's profile is typed at submit (``ProfileSpec``: 4 s/step on an RTX 4090, a 60 s start,
no model, 1 GB of checkpoints); the template's 4 s against the toy's real 0.2 s made its
pre-flight estimate $0.14 for a job that cost $0.02, and nothing ever corrected it. Here each
typed figure is replaced, once a run has measured it, by what the team's runs of the same
*shape* (``jobs.models.shape_of``: the same name, image, command, setup, env and GPU count in
the same team) showed. Another team's runs never count. Each figure is one query over the
newest ``HISTORY_RUNS`` attempts (or jobs) of the shape, the job's own earlier attempts among
them, and a median of what they measured, so one odd host moves nothing and a changed job is
followed within a few runs. The table of what replaces what is in the README ("Estimates that
learn"); in short:

- seconds per step, per machine and per GPU model (``Attempt.seconds_per_step``), the
  reference GPU's from another model by the ratio of their DLPerf, as the selection scales;
  per GPU count: only runs at the job's count are measured at it, and with none, the same job's
  runs at other counts are scaled to it (``selection.seconds_per_step_at``) and say so
  ("estimated from 1-GPU runs"; README, "Several GPUs: cost");
- the bytes the command (and setup) downloaded on a host: the container's counters less what
  the agent moved itself (``net_rx_bytes`` - ``bytes_down``), in place of ``model_gb``;
- the start-up, from the phase boundaries of runs that finished: rent to container up (the
  pull), and the GPU-billed time besides the steps (agent, setup, the command's downloads, the
  last upload, exit), in place of ``container_start_s`` and the downloads at the bandwidth;
- the checkpoints (``Checkpoint`` rows): their median size, what a run uploads per step, and
  how long an upload takes;
- the host: the offers the shape's newest rent weighed (its stored decision's candidates),
  which the pre-flight prices again with what is measured now and takes the cheapest of, as
  the rent would (``market_terms.reference_cost``); else the GPU model and rates its rents
  paid, at the job's GPU count only (an instance's price is for all its GPUs); in place of
  the typed reference host at ``BUDGET_ESTIMATE_DPH`` per GPU and free traffic.

Plain functions of rows; ``history_of`` runs the six queries, ``corrected_profile`` and
``figure_lines`` are pure.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db.models import Q, QuerySet

from hosts import selection
from jobs import image_cache
from jobs.models import Attempt, AttemptState, Checkpoint, CheckpointState, Job
from nomadgpu.humanize import money

# Newest attempts (or jobs, for checkpoints) per figure: enough for a median to shrug off an
# odd host, few enough that a job changed under the same shape is followed within runs.
HISTORY_RUNS = 10
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


# --- The queries --------------------------------------------------------------------------------


def shape_attempts(team_id: int, shape: str, *, job_id: int | None = None) -> QuerySet[Attempt]:
    """The attempts of TEAM_ID's jobs of SHAPE, and JOB_ID's own (a job saved before shapes
    were kept has none), newest first."""
    mine = Q(job_id=job_id) if job_id is not None else Q(pk__in=[])
    same = Q(job__team_id=team_id, job__shape=shape) if shape else Q(pk__in=[])
    return Attempt.objects.filter(mine | same).order_by("-id")


def history_of(
    team_id: int,
    shape: str,
    *,
    job_id: int | None = None,
    image: str = "",
    num_gpus: int | None = None,
    family: Mapping[int, str] | None = None,
) -> History:
    """What TEAM_ID's runs of SHAPE (and JOB_ID's own attempts) measured: one query a figure.
    IMAGE (the shape's) tells the runs whose machine already held it (``jobs.image_cache``).
    With NUM_GPUS (the shape's GPU count), speeds and host prices are those of runs at that
    count; when none measured a speed there, FAMILY (the same job's shape at each other
    count, ``jobs.models.shape_family``) gives one scaled from another count."""
    attempts = shape_attempts(team_id, shape, job_id=job_id)
    others = (
        Attempt.objects.filter(job__team_id=team_id, job__shape__in=list(family.values()))
        if family
        else Attempt.objects.none()
    )
    return History(
        speeds=measured_speeds(attempts, num_gpus=num_gpus, others=others, family=family),
        download=measured_download(attempts),
        startup=measured_startup(
            attempts, found_image=image_cache.attempts_that_found_the_image(team_id, image)
        ),
        checkpoints=measured_checkpoints(attempts),
        host=measured_host(attempts, num_gpus=num_gpus),
        last_decision=last_decision(attempts),
    )


def history_for(job: Job) -> History:
    """``history_of`` JOB's shape in its team, its own attempts included, at its GPU count."""
    gpus = job.gpu_count()
    return history_of(
        job.team_id,
        job.shape,
        job_id=job.pk,
        image=job.image,
        num_gpus=gpus,
        family={n: s for n, s in job.shape_family().items() if n != gpus},
    )


_SPEED_FIELDS = (
    "job_id",
    "machine_id",
    "gpu_name",
    "seconds_per_step",
    "decision__chosen__offer__dlperf",
    "decision__chosen__offer__num_gpus",
)


def measured_speeds(
    attempts: QuerySet[Attempt],
    *,
    num_gpus: int | None = None,
    others: QuerySet[Attempt] | None = None,
    family: Mapping[int, str] | None = None,
) -> Speeds:
    """Median seconds per step by machine and by GPU model over the newest attempts that
    reported one, with the per-GPU DLPerf of the offers they rented (from the decision).

    Speeds are per GPU count: with NUM_GPUS, an attempt whose rented offer had another count
    (the job's own, before its ``num_gpus`` was edited) is not measured at it. When no attempt
    was, those and OTHERS (the runs of the job's shape at other counts, FAMILY mapping each
    count to its shape) are scaled to NUM_GPUS (``selection.seconds_per_step_at``) and the
    result says so (``Speeds.estimated_from``)."""
    rows = list(attempts.exclude(seconds_per_step=None).values_list(*_SPEED_FIELDS)[:HISTORY_RUNS])
    if num_gpus is None:
        return speeds_from(rows)
    same = [r for r in rows if _count(r[5]) in (None, num_gpus)]
    if same:
        return speeds_from(same)
    other = [(r, _count(r[5])) for r in rows]
    if others is not None and family:
        count_of = {shape: n for n, shape in family.items()}
        found = others.exclude(seconds_per_step=None).values_list(*_SPEED_FIELDS, "job__shape")
        other += [(r[:6], count_of.get(r[6])) for r in found[:HISTORY_RUNS]]
    return scaled_speeds(other, num_gpus)


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


def _count(value: object) -> int | None:
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


def measured_download(attempts: QuerySet[Attempt]) -> Measure | None:
    """GB the command and its setup downloaded on one host (median): the container's received
    bytes less the agent's own (checkpoint restores, code), over ended attempts that trained.
    An agent that reported no counters (0) tells nothing, not "nothing downloaded"."""
    rows = (
        attempts.filter(state=AttemptState.ENDED, first_step_at__isnull=False, net_rx_bytes__gt=0)
        .values_list("job_id", "net_rx_bytes", "bytes_down")
        .order_by("-id")[:HISTORY_RUNS]
    )
    found = [(job, max(rx - own, 0) / GB) for job, rx, own in rows]
    return _measure(found)


def measured_startup(
    attempts: QuerySet[Attempt], *, found_image: frozenset[int] = frozenset()
) -> Startup | None:
    """The pull and the GPU-billed time besides the steps (``start_seconds``), medians over
    the newest attempts that finished the job (exit 0): a host lost mid-run ends at its
    detection, not after a last upload and an exit. The pull's leaves out the attempts in
    FOUND_IMAGE, whose machine held the image already: the selection prices a whole pull and
    discounts it per machine (``selection.ImageCache``)."""
    rows = attempts.filter(
        state=AttemptState.ENDED,
        exit_code=0,
        first_step_at__isnull=False,
        seconds_per_step__isnull=False,
        rented_at__isnull=False,
        ended_at__isnull=False,
    ).values("id", *START_FIELDS)[:HISTORY_RUNS]
    rows = list(rows)
    found = [(r["job_id"], *start_seconds(r)) for r in rows]
    if not found:
        return None
    whole = [
        seconds
        for r, (_, seconds, _) in zip(rows, found, strict=True)
        if r["id"] not in found_image
    ]
    return Startup(
        pull_s=statistics.median(whole) if whole else None,
        start_s=statistics.median(start for _, _, start in found),
        runs=len({job for job, _, _ in found}),
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


def measured_checkpoints(attempts: QuerySet[Attempt]) -> Checkpoints | None:
    """The checkpoints of the newest jobs among ATTEMPTS that made any: the median size, what
    a run uploaded per step it checkpointed (every checkpoint, pruned ones too: each was
    uploaded once), and the median upload, announced to ready."""
    jobs = attempts.filter(checkpoints__isnull=False).values("job_id").distinct()
    rows = (
        Checkpoint.objects.filter(job_id__in=jobs.order_by("-job_id")[:HISTORY_RUNS])
        .exclude(state=CheckpointState.FAILED)
        .values_list("job_id", "size", "step", "created_at", "ready_at")
    )
    return checkpoints_from(list(rows))


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


def measured_host(attempts: QuerySet[Attempt], *, num_gpus: int | None = None) -> HostPaid | None:
    """The GPU model the shape's newest rents got most, and the median rates they paid: an
    instance's price is for all its GPUs (``hosts.vast.parsing``), so with NUM_GPUS only rents
    of that many GPUs count (the job's own, before its ``num_gpus`` was edited, do not)."""
    rows = (
        attempts.filter(rented_at__isnull=False)
        .exclude(gpu_name="")
        .values_list(
            "job_id",
            "gpu_name",
            "dph_base",
            "storage_usd_per_gb_hour",
            "download_usd_per_gb",
            "upload_usd_per_gb",
            "decision__chosen__offer__num_gpus",
        )[:HISTORY_RUNS]
    )
    rows = [r[:6] for r in rows if num_gpus is None or _count(r[6]) in (None, num_gpus)]
    if not rows:
        return None
    gpu = Counter(r[1] for r in rows).most_common(1)[0][0]
    rates = [statistics.median(r[i] or 0.0 for r in rows) for i in range(2, 6)]
    return HostPaid(gpu, *rates, runs=len({r[0] for r in rows}))


def last_decision(attempts: QuerySet[Attempt]) -> Mapping:
    """The newest rent decision among ATTEMPTS that weighed offers ({} without one): the
    offers a rent of the shape would most likely weigh again."""
    found = (
        attempts.filter(rented_at__isnull=False, decision__has_key="candidates")
        .values_list("decision", flat=True)
        .first()
    )
    return found or {}


# --- The corrected profile ----------------------------------------------------------------------


def corrected_profile(profile: selection.JobProfile, history: History) -> selection.JobProfile:
    """PROFILE with every figure HISTORY measured in place of the typed one (module
    docstring); a figure never measured stays as typed."""
    changes: dict[str, float] = {}
    if (spp := history.speeds.reference(profile.reference_gpu)) is not None:
        changes["reference_seconds_per_step"] = spp
    if history.download is not None:
        changes["model_gb"] = history.download.value
    if history.startup is not None:
        changes["start_s"] = history.startup.start_s
        changes["pull_s"] = history.startup.pull_s  # None: the image at the bandwidth
    if history.checkpoints is not None:
        changes["checkpoint_gb"] = history.checkpoints.size_gb
        changes["upload_gb"] = history.checkpoints.upload_gb_per_step * profile.steps_total
    return replace(profile, **changes)


# --- In words, for the job page and the preview -------------------------------------------------


@dataclass(frozen=True)
class FigureLine:
    """One figure of the profile as the page says it: what it is, the value used, and
    "measured on N runs" or "typed"."""

    figure: str
    value: str
    runs: int = 0
    # How it was made when it is no plain measure: "estimated from 1-GPU runs".
    how: str = ""

    @property
    def measured(self) -> bool:
        """True when the value comes from earlier runs."""
        return self.runs > 0

    @property
    def source(self) -> str:
        """ "measured on 3 runs", "measured on 1 run", "estimated from 1-GPU runs, 2 runs" or
        "typed"."""
        if not self.measured:
            return "typed"
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        return f"{self.how}, {runs}" if self.how else f"measured on {runs}"


def figure_lines(typed: selection.JobProfile, history: History) -> list[FigureLine]:
    """Each figure of the estimate: measured (its value and number of runs) or typed (TYPED,
    the profile before correction)."""
    used = corrected_profile(typed, history)
    speeds, ckpt, start = history.speeds, history.checkpoints, history.startup
    spp_runs = speeds.runs if speeds.reference(typed.reference_gpu) is not None else 0
    lines = [
        FigureLine(
            "Seconds per step",
            f"{_number(used.reference_seconds_per_step)} s on {typed.reference_gpu}",
            spp_runs,
            speeds.source_words,
        ),
        FigureLine("Downloaded by the command", _size(used.model_gb), _runs(history.download)),
        FigureLine("Start-up and finish", _start_words(used, start), _runs(start)),
        FigureLine("Checkpoint size", _size(used.checkpoint_gb), _runs(ckpt)),
        FigureLine("Checkpoints uploaded per run", _size(used.upload_gb), _runs(ckpt)),
    ]
    if ckpt is not None and ckpt.upload_s is not None:
        lines.append(FigureLine("Checkpoint upload", f"{_number(ckpt.upload_s)} s", ckpt.runs))
    lines.append(host_line(history))
    return lines


def host_line(history: History) -> FigureLine:
    """Which host the pre-flight prices on (``market_terms.reference_cost``), in words."""
    weighed = len(history.last_decision.get("candidates") or [])
    if weighed:
        words = f"the cheapest with these figures of the {weighed} offers the newest rent weighed"
        return FigureLine("Host for the estimate", words, 1)
    return FigureLine("Host for the estimate", _host_words(history.host), _runs(history.host))


def _start_words(used: selection.JobProfile, start: Startup | None) -> str:
    if start is None:
        return f"{_number(used.container_start_s)} s, the image and model at the host's bandwidth"
    if start.pull_s is None:
        return f"{_number(start.start_s)} s on the GPU; the image was on every machine"
    return f"{_number(start.start_s)} s on the GPU, after a {_number(start.pull_s)} s pull"


def _host_words(host: HostPaid | None) -> str:
    if host is None:
        return "the reference GPU at BUDGET_ESTIMATE_DPH, free traffic"
    return f"{host.gpu_name} at {money(host.dph, per_hour=True)}, as the earlier rents paid"


# --- Small helpers ------------------------------------------------------------------------------


def _runs(found: Measure | Startup | Checkpoints | HostPaid | None) -> int:
    return found.runs if found is not None else 0


def _measure(found: list[tuple[int, float]]) -> Measure | None:
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


def _number(value: float) -> str:
    return f"{value:.3g}"


def _size(gb: float) -> str:
    nbytes = gb * GB
    if nbytes < 1:
        return "none"
    for unit, scale in (("GB", GB), ("MB", 1024**2), ("KB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
