"""A row of the job list: the job's progress, its one cost, its projection and interruptions;
the order of every job list; the team's jobs counted by what they are doing; and what the
team's jobs cost this month."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Prefetch, Q, QuerySet

from billing.cost import JobCost, charges_prefetch, job_cost
from billing.cost_in_time import team_cost_between
from billing.periods import period_bounds
from billing.services import projected_total
from billing.spend import job_spend
from jobs import job_status, lifecycle
from jobs.models import ACTIVE_STATES, Attempt, Job, JobState
from nomadgpu.humanize import money, percent_of

# Every job list (dashboard, jobs page, team page, member API, so the CLI's too) is newest
# first; two jobs submitted in one moment come by id, so a list never reorders between polls.
NEWEST_FIRST = ("-created_at", "-id")


def with_portal_data(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """JOBS with what a row needs in four extra queries: attempts, their charges and items
    (the job's cost, ``billing.cost.job_cost``) and the interruption count."""
    # A hedged rent's racers: what its losers cost is the job's (billing.spend).
    attempts = Attempt.objects.order_by("number").prefetch_related(charges_prefetch(), "racers")
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
    recorded_usd: float = 0.0  # what the job's own limit counts (``billing.spend``, recorded)

    @property
    def live(self) -> bool:
        """Still changing: worth polling."""
        return not lifecycle.is_terminal(self.job.state)

    @property
    def waiting_for_first_step(self) -> bool:
        """Queued to recovering, no step reported yet: the pages say "waiting for the first
        step" (the CLI too) rather than a step count they do not have."""
        return self.progress.step is None and self.job.state in ACTIVE_STATES

    @property
    def projected_text(self) -> str:
        """The projection by the money rule ("" when there is none)."""
        return "" if self.projected is None else money(self.projected)

    @property
    def budget_percent(self) -> int | None:
        """What the job's own limit counts, the recorded spend, as a whole percentage of it,
        from the amounts as shown (``humanize.percent_of``); None without a limit. Not the
        invoice: the limit paused the job on what was recorded (``billing.enforce``)."""
        budget = self.job.budget_usd
        return percent_of(self.recorded_usd, budget) if budget else None

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
        recorded_usd=job_spend(job, now=now).total if job.budget_usd else 0.0,
    )


def team_month_spend(team, *, now: datetime) -> JobCost:
    """What TEAM's jobs cost this calendar month (team time zone), by the one cost rule:
    each attempt recorded or invoiced as its job's cost counts it (``billing.cost_in_time``).
    The monthly limit counts the recorded figure (``billing.services``)."""
    start, end = period_bounds("month", now, team.time_zone or "UTC")
    return team_cost_between(team, start, end, now=now)


@dataclass(frozen=True)
class JobCounts:
    """The team's unfinished jobs by what they are doing."""

    live: int  # holding or getting a host, queued included (``Job.objects.active()``)
    paused: int  # paused by a spending limit: no host until someone resumes it
    needs_attention: int  # stopped until a person fixes the job itself


def team_job_counts(team) -> JobCounts:
    """TEAM's jobs counted for the dashboard, in one query. A paused job is not live: it holds
    no host and gets none until resumed, so it is counted apart, as is one needing a person."""
    counts = team.jobs.aggregate(
        live=Count("pk", filter=Q(state__in=ACTIVE_STATES)),
        paused=Count("pk", filter=Q(state=JobState.PAUSED_BUDGET)),
        needs_attention=Count("pk", filter=Q(state=JobState.NEEDS_ATTENTION)),
    )
    return JobCounts(**counts)
