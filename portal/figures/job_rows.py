"""A row of the job list: the job's progress, its one cost, its projection and interruptions;
and what the team's jobs cost this month."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Prefetch, QuerySet

from billing.cost import JobCost, charges_prefetch, job_cost
from billing.periods import period_bounds
from billing.services import projected_total
from billing.spend import spend_between
from jobs import job_status, lifecycle
from jobs.models import Attempt, Job
from nomadgpu.humanize import money, percent_of


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
