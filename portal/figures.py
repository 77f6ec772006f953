"""What the portal shows about jobs, computed from rows: progress, ETA, spend, projections,
the timeline, offers before submit and the points of the charts. Plain functions of data and
``now``; the views only fetch and render.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Prefetch, QuerySet

from billing.periods import period_bounds
from billing.reconcile import job_cost as reconciled_job_cost
from billing.services import projected_total
from billing.spend import (
    Spend,
    attempt_spend,
    spend_between,
    total_spend,
)
from hosts import selection
from hosts.vast import RetryPolicy, VastClient, VastError
from jobs import anatomy, job_status, lifecycle
from jobs.models import Attempt, Job
from jobs.spec import JobSpec
from nomadgpu.humanize import duration

logger = logging.getLogger(__name__)

PREVIEW_TOP_N = 5
# The offers preview runs while the member waits: fail fast instead of retrying for a minute.
PREVIEW_RETRY = RetryPolicy(attempts=2, base_delay=0.2, max_delay=1.0, max_server_wait=2.0)


# --- Rows of the job list ---------------------------------------------------------------------


def with_portal_data(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """JOBS with what a row needs in two extra queries: attempts and the interruption count."""
    return (
        jobs.select_related("team")
        .annotate(n_interruptions=Count("interruptions", distinct=True))
        .prefetch_related(Prefetch("attempts", queryset=Attempt.objects.order_by("number")))
    )


def current_attempt(job: Job) -> Attempt | None:
    """The newest attempt (the live one while the job has a host)."""
    attempts = list(job.attempts.all())
    return attempts[-1] if attempts else None


def projected_cost(job: Job, *, now: datetime, spend: Spend) -> float:
    """Expected total cost of the job (``billing.services.projected_total``; spend for a finished
    one)."""
    if lifecycle.is_terminal(job.state):
        return spend.total
    return projected_total(job, now=now)


def job_cost(job: Job, *, now: datetime) -> tuple[float, str]:
    """(dollars, "invoiced" or "estimated"): what the portal shows as the job's cost."""
    cost = reconciled_job_cost(job, now=now)
    return float(cost.amount), str(cost.basis)


@dataclass
class JobRow:
    job: Job
    attempt: Attempt | None
    progress: job_status.Progress
    spend: Spend
    projected: float | None
    interruptions: int

    @property
    def live(self) -> bool:
        """Still changing: worth polling."""
        return not lifecycle.is_terminal(self.job.state)

    @property
    def host(self) -> str:
        a = self.attempt
        return a.gpu_name if a and a.gpu_name else ""

    @property
    def early_finish(self) -> str:
        return job_status.early_finish_note(self.job)


def job_row(job: Job, *, now: datetime) -> JobRow:
    """Everything the list shows for JOB (expects ``with_portal_data``'s prefetches)."""
    attempt = current_attempt(job)
    progress = job_status.job_progress(job)
    spend = total_spend(job.attempts.all(), now=now)
    interruptions = getattr(job, "n_interruptions", None)
    if interruptions is None:
        interruptions = job.interruptions.count()
    return JobRow(
        job=job,
        attempt=attempt,
        progress=progress,
        spend=spend,
        projected=projected_cost(job, now=now, spend=spend),
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
            # handle_loss stamps the interruption and its event with the same moment.
            found = next((i for i in unmatched if _close(i.detected_at, event.created_at)), None)
            if found is not None:
                unmatched.remove(found)
        out.append(TimelineEntry(event.created_at, event.kind, event.message, found))
    for i in unmatched:  # an interruption whose event is missing still belongs on the timeline
        out.append(TimelineEntry(i.detected_at, "host_lost", f"host lost ({i.cause})", i))
    return sorted(out, key=lambda e: e.at)


def _close(a: datetime, b: datetime) -> bool:
    return abs((a - b).total_seconds()) < 2


def decision_of(attempt: Attempt | None) -> dict | None:
    """The stored selection decision (``hosts.selection.Decision.as_dict``) of ATTEMPT."""
    if attempt is None or not attempt.decision:
        return None
    return attempt.decision


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


def line_chart(
    series: list[tuple[float, float]], *, width: int = 600, height: int = 160
) -> Chart | None:
    """SERIES (x, y pairs) scaled into a WIDTH x HEIGHT box, y up; None with under two points."""
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
    return Chart(pts, x0, x1, y0, y1, len(series), width, height, pad)


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


@dataclass
class OffersPreview:
    """The best offers for a spec now, or why there are none."""

    ranked: list[dict] = field(default_factory=list)
    estimated_total_usd: float | None = None
    offers_seen: int = 0
    error: str = ""


def requirements_from_spec(spec: JobSpec) -> selection.Requirements:
    """The selection's requirements for a spec not yet submitted (``renting.requirements_for``
    of a new job: nothing to avoid yet)."""
    data = spec.requirements.model_dump()
    data["gpu_names"] = tuple(data["gpu_names"])
    return selection.Requirements(**data)


def profile_from_spec(spec: JobSpec) -> selection.JobProfile:
    """The cost model's profile for a spec not yet submitted (``renting.profile_for``)."""
    return selection.JobProfile(**spec.profile.model_dump(), steps_total=spec.total_steps or 0)


def preview_offers(spec: JobSpec, *, team, client: VastClient | None = None) -> OffersPreview:
    """The top offers for SPEC on TEAM's marketplace now, with the cost of the whole job."""
    req, profile = requirements_from_spec(spec), profile_from_spec(spec)
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
    decision = selection.choose_offer(offers, req, profile, top_n=PREVIEW_TOP_N)
    if decision is None:
        return OffersPreview(
            offers_seen=len(offers), error="No offer on the market matches these requirements now."
        )
    data = decision.as_dict()
    return OffersPreview(
        ranked=data["candidates"],
        estimated_total_usd=data["estimated_total_usd"],
        offers_seen=data["offers_seen"],
    )


def interruptible_blocker(spec: JobSpec, *, team, client: VastClient | None = None) -> str | None:
    """For a spec that asks for ``rental: interruptible``: why no offer meeting its
    requirements can be bid on now (none has a ``min_bid``, or none under its
    ``max_bid_dph``), else None. A marketplace that cannot be asked, or has no matching offer
    at all, says nothing here: the rent searches again, as for any job."""
    req = requirements_from_spec(spec)
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
