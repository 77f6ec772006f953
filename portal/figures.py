"""What the portal shows about jobs, computed from rows: progress, ETA, spend, projections,
the timeline, offers before submit and the points of the charts. Plain functions of data and
``now``; the views only fetch and render.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Prefetch, QuerySet

from billing.cost import JobCost, charges_prefetch, job_cost
from billing.periods import period_bounds
from billing.services import projected_total
from billing.spend import attempt_spend, spend_between
from hosts import selection
from hosts.vast import RetryPolicy, VastClient, VastError
from jobs import anatomy, job_status, lifecycle, rent_decision
from jobs.models import Attempt, Job, shape_family, shape_of
from jobs.rent_decision import RankedOffer
from jobs.renting import corrections, image_cache, measures, shape_history
from jobs.renting.terms import (
    profile_from_spec,
    requirements_from_spec,
    typed_profile_for,
)
from jobs.spec import JobSpec
from jobs.stored_spec import StoredSpecInvalid
from nomadgpu.humanize import duration, instance_price, money, percent_of

logger = logging.getLogger(__name__)

PREVIEW_TOP_N = 5
# The offers preview runs while the member waits: fail fast instead of retrying for a minute.
PREVIEW_RETRY = RetryPolicy(attempts=2, base_delay=0.2, max_delay=1.0, max_server_wait=2.0)


# --- Rows of the job list ---------------------------------------------------------------------


def with_portal_data(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """JOBS with what a row needs in four extra queries: attempts, their charges and items
    (the job's cost, ``billing.cost.job_cost``) and the interruption count."""
    attempts = Attempt.objects.order_by("number").prefetch_related(charges_prefetch())
    return (
        jobs.select_related("team")
        .annotate(n_interruptions=Count("interruptions", distinct=True))
        .prefetch_related(Prefetch("attempts", queryset=attempts))
    )


def current_attempt(job: Job) -> Attempt | None:
    """The newest attempt (the live one while the job has a host)."""
    attempts = list(job.attempts.all())
    return attempts[-1] if attempts else None


def projected_cost(job: Job, *, now: datetime, cost: JobCost) -> float | None:
    """Expected total cost of the job (``billing.services.projected_total``; its COST once it
    finished; None while its stored spec does not validate)."""
    if lifecycle.is_terminal(job.state):
        return cost.amount
    return projected_total(job, now=now)


@dataclass
class JobRow:
    job: Job
    attempt: Attempt | None
    progress: job_status.Progress
    cost: JobCost  # ``billing.cost.job_cost``: the one cost, its label and breakdown
    projected: float | None
    interruptions: int

    @property
    def live(self) -> bool:
        """Still changing: worth polling."""
        return not lifecycle.is_terminal(self.job.state)

    @property
    def projected_text(self) -> str:
        """The projection by the money rule ("" when there is none)."""
        return "" if self.projected is None else money(self.projected)

    @property
    def budget_percent(self) -> int | None:
        """The job's cost as a whole percentage of its own limit, from the amounts as shown
        (``humanize.percent_of``); None without a limit."""
        budget = self.job.budget_usd
        return percent_of(self.cost.total, budget) if budget else None

    @property
    def host(self) -> str:
        a = self.attempt
        return a.gpu_name if a and a.gpu_name else ""

    @property
    def early_finish(self) -> str:
        return job_status.early_finish_note(self.job)

    @property
    def rework(self) -> str:
        """Why the step went back after a host loss (``job_status.rework_note``)."""
        return job_status.rework_note(self.job)


def job_row(job: Job, *, now: datetime) -> JobRow:
    """Everything the list shows for JOB (expects ``with_portal_data``'s prefetches)."""
    attempt = current_attempt(job)
    progress = job_status.job_progress(job)
    cost = job_cost(job, now=now)
    interruptions = getattr(job, "n_interruptions", None)
    if interruptions is None:
        interruptions = job.interruptions.count()
    return JobRow(
        job=job,
        attempt=attempt,
        progress=progress,
        cost=cost,
        projected=projected_cost(job, now=now, cost=cost),
        interruptions=interruptions,
    )


def team_month_spend(team, *, now: datetime) -> float:
    """What TEAM's jobs cost this calendar month (team time zone), as the monthly limit
    counts it."""
    start, end = period_bounds("month", now, team.time_zone or "UTC")
    attempts = Attempt.objects.filter(job__team=team).exclude(rented_at=None)
    return spend_between(attempts, start, end, now=now).total


# --- The job page -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    kind: str
    message: str
    interruption: Any = None  # an Interruption for "host lost" entries

    @property
    def label(self) -> str:
        return self.kind.replace("_", " ")

    @property
    def detection_s(self) -> float | None:
        """Seconds from the last heartbeat to the detection of the loss."""
        i = self.interruption
        if i is None or i.last_heartbeat_at is None:
            return None
        return max((i.detected_at - i.last_heartbeat_at).total_seconds(), 0.0)

    @property
    def downtime_s(self) -> float | None:
        """Seconds from the detection to training running again."""
        i = self.interruption
        if i is None or i.running_again_at is None:
            return None
        return (i.running_again_at - i.detected_at).total_seconds()

    @property
    def anatomy(self) -> dict | None:
        """The interruption's downtime by phase (``jobs.anatomy.breakdown``) and its pieces
        as one stacked bar."""
        if self.interruption is None:
            return None
        split = anatomy.breakdown(self.interruption)
        work = split["lost_work"]
        return {
            **split,
            "pieces": anatomy.segments(split["phases"]),
            "caption": f"Where the downtime went: {duration(split['total_s'])} in all",
            "bar_id": f"anatomy-{self.interruption.pk}",
            "gpu_text": duration(work["gpu_s"]),
        }


def timeline(job: Job) -> list[TimelineEntry]:
    """The job's events, oldest first; a host_lost event carries its Interruption (detection
    and recovery times) when one was recorded for that attempt."""
    unmatched = list(job.interruptions.select_related("replacement").order_by("detected_at"))
    out: list[TimelineEntry] = []
    for event in job.events.all():
        found = None
        if event.kind == "host_lost":
            found = _interruption_of(event, unmatched)
            if found is not None:
                unmatched.remove(found)
        out.append(TimelineEntry(event.created_at, event.kind, event.message, found))
    for i in unmatched:  # an interruption whose event is missing still belongs on the timeline
        out.append(TimelineEntry(i.detected_at, "host_lost", f"host lost ({i.cause})", i))
    return sorted(out, key=lambda e: e.at)


def _interruption_of(event, interruptions: list) -> Any:
    """The Interruption a host_lost EVENT reports: its attempt's, when the event names it (a
    host waited for while offline is dated from when it went offline, before its event);
    else the one stamped with the same moment, as handle_loss stamps both."""
    attempt_id = (event.data or {}).get("attempt_id")
    if attempt_id is not None:
        return next((i for i in interruptions if i.attempt_id == attempt_id), None)
    return next((i for i in interruptions if _close(i.detected_at, event.created_at)), None)


def _close(a: datetime, b: datetime) -> bool:
    return abs((a - b).total_seconds()) < 2


# --- Charts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    """A line chart as SVG coordinates: ``points`` for a polyline, the axes' ranges for labels."""

    points: str
    x_min: float
    x_max: float
    y_min: float
    y_max: float
    count: int
    width: int = 600
    height: int = 160
    pad: int = 6
    y_format: Callable[[float], str] = str  # how the axis labels read

    @property
    def y_min_text(self) -> str:
        return self.y_format(self.y_min)

    @property
    def y_max_text(self) -> str:
        return self.y_format(self.y_max)


def line_chart(
    series: list[tuple[float, float]],
    *,
    width: int = 600,
    height: int = 160,
    y_format: Callable[[float], str] = str,
) -> Chart | None:
    """SERIES (x, y pairs) scaled into a WIDTH x HEIGHT box, y up, its axis labels written by
    Y_FORMAT; None with under two points."""
    if len(series) < 2:
        return None
    xs, ys = [x for x, _ in series], [y for _, y in series]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    pad = 6
    sx = (width - 2 * pad) / ((x1 - x0) or 1)
    sy = (height - 2 * pad) / ((y1 - y0) or 1)
    pts = " ".join(
        f"{pad + (x - x0) * sx:.1f},{height - pad - (y - y0) * sy:.1f}" for x, y in series
    )
    return Chart(pts, x0, x1, y0, y1, len(series), width, height, pad, y_format)


def spend_text(usd: float) -> str:
    """A spend chart's axis label, by the one money rule (``nomadgpu.humanize.money``)."""
    return money(usd)


def loss_series(job: Job) -> list[tuple[float, float]]:
    """(step, loss) from the sampled loss points."""
    return [(float(s), float(v)) for s, v in job.loss_points.values_list("step", "loss")]


def spend_series(
    job: Job, *, now: datetime, points: int = 40
) -> tuple[list[tuple[float, float]], str]:
    """((time since submit, dollars) at POINTS moments from submit to now or the finish, unit).

    The unit (s, min or h) keeps the axis readable for a one-minute toy and a day-long run.
    Time-billed parts grow with time; traffic counters carry no times, so each attempt's
    traffic is counted from its rent on (a slight overstatement early in an attempt).
    """
    attempts = list(job.attempts.all())
    start = job.created_at
    end = min(job.finished_at or now, now)
    if end <= start:
        return [], "s"
    span_s = (end - start).total_seconds()
    unit, per = (
        ("s", 1.0) if span_s < 180 else ("min", 60.0) if span_s < 3 * 3600 else ("h", 3600.0)
    )
    step = (end - start) / (points - 1)
    out = []
    for i in range(points):
        t = start + step * i
        dollars = sum(
            attempt_spend(a, now=t).total for a in attempts if a.rented_at and a.rented_at <= t
        )
        out.append(((t - start).total_seconds() / per, dollars))
    return out, unit


# --- Offers before submit ---------------------------------------------------------------------


@dataclass(frozen=True)
class OfferRow:
    """One row of an offers table, priced the way it would be rented. Its columns multiply
    out and add up: ``gpu_usd`` is ``usd_per_hour`` x ``train_h``, ``startup_usd`` the same
    price over the GPU-billed start-up (model download, container start; the image pull is
    not GPU time), and ``total_usd`` the sum of every dollar column (None: interruptions come
    faster than the work, so the run never finishes)."""

    rank: int
    num_gpus: int
    gpu_name: str
    datacenter: bool
    rental: str
    usd_per_hour: float
    inet_down_mbps: float | None
    reliability: float | None
    where: str
    train_h: float
    startup_gpu_h: float
    storage_usd: float
    download_usd: float
    upload_usd: float
    interruptions_usd: float | None
    # The chance the machine still holds the job's image from an earlier rental of the team
    # (``jobs.renting.image_cache``); its pull is priced at the rest. 0: it never pulled it.
    image_cached_chance: float = 0.0
    machine_id: int | None = None

    @property
    def image_cached_text(self) -> str:
        """ "image cached (80 %)" for a machine that pulled the image before, else ""."""
        if self.image_cached_chance <= 0:
            return ""
        return f"image cached ({round(self.image_cached_chance * 100)} %)"

    @property
    def gpu_usd(self) -> float:
        """Training's GPU time at the row's price."""
        return self.usd_per_hour * self.train_h

    @property
    def startup_usd(self) -> float:
        """The start-up's GPU time at the row's price."""
        return self.usd_per_hour * self.startup_gpu_h

    @property
    def total_usd(self) -> float | None:
        """The sum of the row's dollar columns, interruptions included."""
        if self.interruptions_usd is None:
            return None
        parts = (self.gpu_usd, self.startup_usd, self.storage_usd, self.download_usd)
        return sum(parts) + self.upload_usd + self.interruptions_usd

    @property
    def texts(self) -> dict[str, str]:
        """Every amount as ``nomadgpu.humanize.money`` writes it, by column."""
        amounts = {
            "gpu": self.gpu_usd,
            "startup": self.startup_usd,
            "storage": self.storage_usd,
            "download": self.download_usd,
            "upload": self.upload_usd,
            "interruptions": self.interruptions_usd,
            "total": self.total_usd,
        }
        out = {k: "never finishes" if v is None else money(v) for k, v in amounts.items()}
        # The instance's price for all its GPUs, its per-GPU price beside it for several.
        return {**out, "usd_per_hour": instance_price(self.usd_per_hour, self.num_gpus)}


def offer_row(rank: int, candidate: RankedOffer) -> OfferRow:
    """CANDIDATE as row RANK: its columns at the price it would be rented at."""
    offer, cost, price = candidate.offer, candidate.cost, candidate.usd_per_hour
    train_h = float(cost.get("train_h") or 0.0)
    base = float(cost.get("total_usd") or 0.0)
    expected = candidate.expected_total_usd
    return OfferRow(
        rank=rank,
        num_gpus=int(offer.get("num_gpus") or 1),
        gpu_name=str(offer.get("gpu_name") or "GPU"),
        datacenter=bool(offer.get("datacenter")),
        rental=candidate.rental_label,
        usd_per_hour=price,
        inet_down_mbps=offer.get("inet_down_mbps"),
        reliability=offer.get("reliability"),
        where=offer.get("geolocation") or "—",
        train_h=train_h,
        startup_gpu_h=max(_gpu_billed_h(cost, price) - train_h, 0.0),
        storage_usd=float(cost.get("storage_usd") or 0.0),
        download_usd=float(cost.get("download_usd") or 0.0),
        upload_usd=float(cost.get("upload_usd") or 0.0),
        interruptions_usd=None if expected is None else max(expected - base, 0.0),
        image_cached_chance=float(cost.get("image_cached_chance") or 0.0),
        machine_id=offer.get("machine_id"),
    )


def _gpu_billed_h(cost: Mapping[str, Any], usd_per_hour: float) -> float:
    # Stored before the billed hours were kept: what the stored GPU dollars bought.
    if cost.get("gpu_billed_h") is not None:
        return float(cost["gpu_billed_h"])
    gpu_usd = float(cost.get("gpu_usd") or 0.0)
    return gpu_usd / usd_per_hour if usd_per_hour else float(cost.get("train_h") or 0.0)


def offer_rows(decision: Mapping[str, Any] | None) -> list[OfferRow]:
    """DECISION's candidates (``selection.Decision.as_dict``, fresh or stored on an attempt)
    as offers-table rows, the one it rents first."""
    if not decision:
        return []
    return [offer_row(n, c) for n, c in enumerate(rent_decision.ranked_offers(decision), 1)]


@dataclass
class OffersPreview:
    """The best offers for a spec now, or why there are none. The headline is the first
    row's total: the cost of the row it would rent."""

    rows: list[OfferRow] = field(default_factory=list)
    offers_seen: int = 0
    error: str = ""

    @property
    def chosen(self) -> OfferRow | None:
        """The row it would rent."""
        return self.rows[0] if self.rows else None

    @property
    def estimated_total_usd(self) -> float | None:
        """The estimated cost of the job: the chosen row's total."""
        return self.chosen.total_usd if self.chosen else None


def preview_offers(spec: JobSpec, *, team, client: VastClient | None = None) -> OffersPreview:
    """The top offers for SPEC on TEAM's marketplace now, with the cost of the whole job."""
    req = requirements_from_spec(spec.requirements)
    history = spec_history(spec, team=team)
    profile = corrections.corrected_profile(
        profile_from_spec(spec.profile, steps_total=spec.total_steps or 0), history
    )
    own = client is None
    client = client or VastClient.from_settings(team, retry=PREVIEW_RETRY)
    try:
        offers = client.search_offers(
            selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
        )
    except VastError as exc:
        logger.info("offers preview failed for team %s: %s", getattr(team, "slug", team), exc)
        return OffersPreview(error=f"The marketplace could not be asked for offers: {exc}")
    finally:
        if own:
            client.close()
    speeds = history.speeds.book()
    images = image_cache.image_cached_odds(team.pk, spec.image)
    decision = selection.choose_offer(
        offers, req, profile, speeds, top_n=PREVIEW_TOP_N, images=images
    )
    if decision is None:
        return OffersPreview(
            offers_seen=len(offers), error="No offer on the market matches these requirements now."
        )
    data = decision.as_dict()
    return OffersPreview(rows=offer_rows(data), offers_seen=data["offers_seen"])


def interruptible_blocker(spec: JobSpec, *, team, client: VastClient | None = None) -> str | None:
    """For a spec that asks for ``rental: interruptible``: why no offer meeting its
    requirements can be bid on now (none has a ``min_bid``, or none under its
    ``max_bid_dph``), else None. A marketplace that cannot be asked, or has no matching offer
    at all, says nothing here: the rent searches again, as for any job."""
    req = requirements_from_spec(spec.requirements)
    if req.rental != selection.INTERRUPTIBLE:
        return None
    own = client is None
    client = client or VastClient.from_settings(team, retry=PREVIEW_RETRY)
    try:
        offers = client.search_offers(
            selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
        )
    except VastError:
        return None
    finally:
        if own:
            client.close()
    kept, _ = selection.filter_offers(offers, req)
    if not kept or any(selection.rentals_to_weigh(offer, req) for offer in kept):
        return None
    cap = f" at or under ${req.max_bid_dph}/h" if req.max_bid_dph else ""
    return (
        f"rental is interruptible, but none of the {len(kept)} offers that meet the "
        f"requirements takes a bid{cap}; ask for rental auto or on-demand, or raise max_bid_dph"
    )


def gpu_count_blocker(spec: JobSpec, *, team, client: VastClient | None = None) -> str | None:
    """Why SPEC's ``requirements.num_gpus`` can never be rented: no offer on TEAM's market has
    that many GPUs of its models on one host (the largest offer is asked for: Vast's query
    ordered by ``num_gpus``, one offer), else None. One GPU is never refused (and costs no
    search). A market that cannot be asked, or has no offer of the models at all, refuses
    nothing: the provider being briefly unreachable must not fail a submit, and the rent
    searches again and says "no offer" as for any job. Only the GPU model and the verified
    rule narrow the search: the other requirements are the rent's to weigh."""
    req = requirements_from_spec(spec.requirements)
    if req.num_gpus <= 1:
        return None
    query: dict[str, Any] = {"verified": {"eq": True} if req.verified_only else None}
    if req.gpu_names:
        names = list(req.gpu_names)
        query["gpu_name"] = {"eq": names[0]} if len(names) == 1 else {"in": names}
    own = client is None
    client = client or VastClient.from_settings(team, retry=PREVIEW_RETRY)
    try:
        largest = client.search_offers(query, order=[["num_gpus", "desc"]], limit=1)
    except VastError as exc:
        logger.info("GPU count check skipped for team %s: %s", getattr(team, "slug", team), exc)
        return None
    finally:
        if own:
            client.close()
    if not largest or largest[0].num_gpus >= req.num_gpus:
        return None
    models = " or ".join(req.gpu_names) if req.gpu_names else "any model"
    return (
        f"no offer has {req.num_gpus} GPUs of {models} on one host; the most is "
        f"{largest[0].num_gpus}: lower requirements.num_gpus"
    )


# --- Measured or typed: what an estimate is made of --------------------------------------------


def spec_history(spec: JobSpec, *, team) -> measures.History:
    """What TEAM's runs of SPEC's shape measured (nothing for a shape never run)."""
    parts = {"name": spec.name, "image": spec.image, "command": spec.command,
             "setup": spec.setup, "env": spec.env}  # fmt: skip
    gpus = spec.requirements.num_gpus
    family = {n: shape for n, shape in shape_family(**parts).items() if n != gpus}
    return shape_history.history_of(
        team.pk, shape_of(**parts, num_gpus=gpus), image=spec.image, num_gpus=gpus, family=family
    )


def preview_figures(spec: JobSpec, *, team) -> list[corrections.FigureLine]:
    """The new-job preview's figures, each measured (on how many runs) or typed."""
    typed = profile_from_spec(spec.profile, steps_total=spec.total_steps or 0)
    return corrections.figure_lines(typed, spec_history(spec, team=team))


def estimate_figures(job: Job) -> list[corrections.FigureLine]:
    """The job page's figures, each measured (on how many runs) or typed; none while the
    stored spec does not validate (the page says that elsewhere)."""
    try:
        typed = typed_profile_for(job)
    except StoredSpecInvalid:
        return []
    return corrections.figure_lines(typed, shape_history.history_for(job))


@dataclass(frozen=True)
class GpuRow:
    """One GPU of an attempt's latest heartbeat, as the job page writes it."""

    label: str  # "GPU 1"
    bus_id: str
    name: str
    utilization: str  # "97 %", or "—" where nvidia-smi had no value
    memory: str  # "20,123 / 24,564 MiB"
    temperature: str  # "61 °C"
    ecc_errors: str  # uncorrected ECC errors since the driver loaded; "—" without ECC
    error: str  # "lost: GPU is lost. …" for a GPU that fell off the bus; "" when healthy


def gpu_rows(attempt: Attempt | None) -> list[GpuRow]:
    """ATTEMPT's GPUs as its last heartbeat listed them (none before one, or from an agent
    too old to send them)."""
    if attempt is None or not isinstance(attempt.gpus, list):
        return []
    return [gpu_row(g) for g in attempt.gpus if isinstance(g, dict)]


def gpu_row(gpu: Mapping[str, Any]) -> GpuRow:
    index = gpu.get("index")
    used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
    return GpuRow(
        label=f"GPU {index}" if index is not None else "GPU ?",
        bus_id=str(gpu.get("pci_bus_id") or ""),
        name=str(gpu.get("name") or ""),
        utilization=_reading(gpu.get("utilization_pct"), " %"),
        memory=f"{_reading(used, '')} / {_reading(total, ' MiB')}",
        temperature=_reading(gpu.get("temperature_c"), " °C"),
        ecc_errors=_reading(gpu.get("ecc_uncorrected"), ""),
        error=str(gpu.get("error") or ""),
    )


def _reading(value: Any, unit: str) -> str:
    """A whole number with thousands separators and UNIT; "—" when nvidia-smi had none."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return f"{value:,.0f}{unit}"
