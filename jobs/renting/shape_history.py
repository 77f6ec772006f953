"""What the team measured on earlier runs of a job's shape, and the profile it corrects.

A job's profile is typed at submit (``ProfileSpec``: 4 s/step on an RTX 4090, a 60 s start,
no model, 1 GB of checkpoints, unless the job or its template types better); a typed figure
is never corrected by itself. Here each typed figure is replaced, once a run has measured it,
by what the team's runs of the same *shape* (``jobs.models.shape_of``: the same image, setup,
command and GPU count in the same team; not the name or the env) showed. Another team's runs
never count. Each figure is one query over the newest ``HISTORY_RUNS`` attempts (or jobs) of
the shape, the job's own earlier attempts among them, and a median of what they measured, so
one odd host moves nothing and a changed job (a new batch size in its env) is followed within
a few runs. The table of what replaces what is in docs/budgets-and-costs.md
("Estimates that learn"); in short:

- seconds per step, per machine and per GPU model (``Attempt.seconds_per_step``), the
  reference GPU's from another model by the ratio of their DLPerf, as the selection scales;
  per GPU count: only runs at the job's count are measured at it, and with none, the same job's
  runs at other counts are scaled to it (``selection.seconds_per_step_at``) and say so
  ("estimated from 1-GPU runs"; docs/several-gpus.md, "Cost");
- the bytes the command (and setup) downloaded on a host: the container's counters less what
  the agent moved itself (``net_rx_bytes`` - ``bytes_down``), in place of ``model_gb``;
- the start-up, from the phase boundaries of runs that finished: rent to container up (the
  pull), and the GPU-billed time besides the steps (agent, setup, the command's downloads, the
  last upload, exit), in place of ``container_start_s`` and the downloads at the bandwidth;
- the checkpoints (``Checkpoint`` rows): their median size, what a run uploads per step, and
  how long an upload takes;
- the host: the offers the shape's newest rent weighed (its stored decision's candidates),
  which the pre-flight prices again with what is measured now and takes the cheapest of, as
  the rent would (``jobs.renting.reference.reference_cost``); else the GPU model and rates its rents
  paid, at the job's GPU count only (an instance's price is for all its GPUs); in place of
  the typed reference host at ``BUDGET_ESTIMATE_DPH`` per GPU and free traffic.

``history_of`` runs the six queries here; the figures are ``measures``, and how they correct
the typed profile is ``corrections``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping

from django.db.models import Q, QuerySet

from jobs.models import Attempt, AttemptState, Checkpoint, CheckpointState, Job
from jobs.renting import image_cache
from jobs.renting.measures import (
    GB,
    START_FIELDS,
    Checkpoints,
    History,
    HostPaid,
    Measure,
    Speeds,
    Startup,
    checkpoints_from,
    gpu_count_of,
    median_measure,
    scaled_speeds,
    speeds_from,
    start_seconds,
)

# Newest attempts (or jobs, for checkpoints) per figure: enough for a median to shrug off an
# odd host, few enough that a job changed under the same shape is followed within runs.
HISTORY_RUNS = 10


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
    IMAGE (the shape's) tells the runs whose machine already held it (``jobs.renting.image_cache``).
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
    same = [r for r in rows if gpu_count_of(r[5]) in (None, num_gpus)]
    if same:
        return speeds_from(same)
    other = [(r, gpu_count_of(r[5])) for r in rows]
    if others is not None and family:
        count_of = {shape: n for n, shape in family.items()}
        found = others.exclude(seconds_per_step=None).values_list(*_SPEED_FIELDS, "job__shape")
        other += [(r[:6], count_of.get(r[6])) for r in found[:HISTORY_RUNS]]
    return scaled_speeds(other, num_gpus)


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
    return median_measure(found)


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
    rows = [r[:6] for r in rows if num_gpus is None or gpu_count_of(r[6]) in (None, num_gpus)]
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
