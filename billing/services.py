"""Spending limits: where each limit stands, the pre-flight at submit, the reservation made
when a rent is planned, and resuming a paused job. Enforcement is ``billing.enforce``.

Limits (``LimitKind``): the job's own ``Job.budget_usd`` over its whole life; the team's
daily, weekly (from Monday) and monthly limits over calendar periods in the team's time zone;
the per-member monthly limit over the jobs a member submitted. Spend comes from the attempts'
recorded rates (``billing.spend``), clipped to each period.

The pre-flight estimate is the selection's cost model (``hosts.selection.estimate_cost``)
on a reference host, not a market search: submitting must not depend on the provider
answering, and the cheapest host is not known until the rent. The reference host is the
profile's reference GPU at ``BUDGET_ESTIMATE_DPH`` $/h per GPU (default 0.40, an RTX 4090 at
the field report's prices), the job's disk at $0.15/GB/month, free traffic, and the job's
minimum bandwidth, running at the profile's reference seconds per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from billing.models import BudgetPause, BudgetReservation, LimitKind, TeamBudget
from billing.periods import period_bounds
from billing.spend import burn_rate_per_hour, job_spend, spend_between
from jobs.models import Attempt, Job, JobState

ACTIVE_JOB_STATES = (
    JobState.QUEUED,
    JobState.RENTING,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.RECOVERING,
)
WARN_AT = 0.8
STORAGE_USD_PER_GB_MONTH = 0.15
# A job waiting for budget (queued to start when it allows, or refused a rent) looks again
# this often: a new period or a raised limit is picked up within a minute.
RECHECK_S = 60


class BudgetExceeded(Exception):
    """A limit refuses the job; the message carries the numbers (shown by portal and API)."""


@dataclass(frozen=True)
class LimitStatus:
    """Where one limit stands at one moment."""

    kind: str
    limit_usd: Decimal
    spent_usd: float
    period_start: datetime
    period_end: datetime | None  # None: the job's whole life
    team_id: int
    job_id: int | None = None
    user_id: int | None = None
    rate_usd_per_h: float = 0.0  # what the scope's live attempts cost per hour now

    @property
    def ratio(self) -> float:
        return self.spent_usd / float(self.limit_usd) if self.limit_usd > 0 else float("inf")

    @property
    def label(self) -> str:
        return f"{LimitKind(self.kind).label} limit ${self.limit_usd}"

    def key(self) -> str:
        """Names this limit in this period (one warning each)."""
        who = self.job_id if self.kind == LimitKind.JOB else self.user_id or ""
        return f"{self.team_id}:{self.kind}:{who}:{self.period_start.isoformat()}"

    def affected_jobs(self, *, started_only: bool = False) -> Iterable[int]:
        """Ids of the active jobs under this limit; STARTED_ONLY leaves out queued jobs (they
        hold no machine, and the rent reservation keeps them waiting until the budget allows)."""
        states = ACTIVE_JOB_STATES[1:] if started_only else ACTIVE_JOB_STATES
        jobs = Job.objects.filter(team_id=self.team_id, state__in=states)
        if self.kind == LimitKind.JOB:
            jobs = jobs.filter(pk=self.job_id)
        elif self.kind == LimitKind.MEMBER_MONTH:
            jobs = jobs.filter(created_by_id=self.user_id)
        return jobs.values_list("pk", flat=True)

    def describe(self) -> str:
        return f"{self.label}: ${self.spent_usd:.2f} spent ({self.ratio:.0%})"


def team_limits(team) -> TeamBudget | None:
    return TeamBudget.objects.filter(team=team).first()


def _attempts_in(lo: datetime, hi: datetime, **scope):
    return (
        Attempt.objects.filter(**scope)
        .exclude(rented_at=None)
        .filter(rented_at__lt=hi)
        .filter(Q(ended_at=None) | Q(ended_at__gt=lo))
    )


def _status(kind, limit, lo, hi, team_id, now, *, job_id=None, user_id=None, **scope):
    attempts = list(_attempts_in(lo, hi or now, **scope))
    return LimitStatus(
        kind=kind,
        limit_usd=limit,
        spent_usd=spend_between(attempts, lo, hi or now, now=now).total,
        period_start=lo,
        period_end=hi,
        team_id=team_id,
        job_id=job_id,
        user_id=user_id,
        rate_usd_per_h=sum(burn_rate_per_hour(a, now=now) for a in attempts),
    )


def job_limit_status(job: Job, *, now: datetime) -> LimitStatus | None:
    """The job's own limit over its whole life, or None when it has none."""
    if job.budget_usd is None:
        return None
    return _status(
        LimitKind.JOB,
        job.budget_usd,
        job.created_at,
        None,
        job.team_id,
        now,
        job_id=job.pk,
        job=job,
    )


def team_limit_statuses(team, *, now: datetime, users: Iterable[int] = ()) -> list[LimitStatus]:
    """The team's period limits at NOW; the member limit for each of USERS."""
    limits = team_limits(team)
    if limits is None:
        return []
    found = []
    for kind, value in (
        (LimitKind.DAY, limits.daily_usd),
        (LimitKind.WEEK, limits.weekly_usd),
        (LimitKind.MONTH, limits.monthly_usd),
    ):
        if value is not None:
            lo, hi = period_bounds(kind, now, team.time_zone)
            found.append(_status(kind, value, lo, hi, team.pk, now, job__team=team))
    if limits.member_monthly_usd is not None:
        lo, hi = period_bounds(LimitKind.MEMBER_MONTH, now, team.time_zone)
        for user_id in sorted(set(users) - {None}):
            found.append(
                _status(
                    LimitKind.MEMBER_MONTH,
                    limits.member_monthly_usd,
                    lo,
                    hi,
                    team.pk,
                    now,
                    user_id=user_id,
                    job__team=team,
                    job__created_by_id=user_id,
                )
            )
    return found


def statuses_for_job(job: Job, *, now: datetime) -> list[LimitStatus]:
    """Every limit that applies to JOB."""
    own = job_limit_status(job, now=now)
    team = team_limit_statuses(job.team, now=now, users=[job.created_by_id])
    return ([own] if own else []) + team


# --- Estimates, pre-flight and reservations ----------------------------------------------------


def estimate_remaining_usd(job: Job) -> float:
    """The selection's cost model for the rest of JOB on the reference host (module docstring)."""
    from hosts import selection
    from hosts.vast import Offer
    from jobs.renting import profile_for, requirements_for

    req, profile = requirements_for(job), profile_for(job)
    dph = float(settings.BUDGET_ESTIMATE_DPH) * req.num_gpus
    offer = Offer(
        id=0,
        machine_id=None,
        host_id=None,
        gpu_name=profile.reference_gpu,
        num_gpus=req.num_gpus,
        gpu_ram_gb=None,
        gpu_total_ram_gb=None,
        cpu_cores_effective=None,
        cpu_ram_gb=None,
        disk_space_gb=None,
        cuda_max_good=None,
        compute_cap=None,
        dph_base=dph,
        dph_total=None,
        min_bid=None,
        storage_usd_per_gb_hour=STORAGE_USD_PER_GB_MONTH / 720,
        download_usd_per_gb=0.0,
        upload_usd_per_gb=0.0,
        inet_down_mbps=req.min_inet_down_mbps or 500.0,
        inet_up_mbps=None,
        reliability=1.0,
        verified=True,
        datacenter=False,
        dlperf=None,
        geolocation=None,
    )
    speeds = selection.SpeedBook(
        by_model={profile.reference_gpu: profile.reference_seconds_per_step}
    )
    return selection.estimate_cost(offer, profile, speeds, req).total_usd


def held_usd(reservation: BudgetReservation, *, now: datetime) -> float:
    """What RESERVATION still holds: its estimate minus what the job spent since."""
    spent_since = job_spend(reservation.job, now=now).total - reservation.spent_at_usd
    return max(reservation.amount_usd - spent_since, 0.0)


def _held_by_others(status: LimitStatus, job: Job, *, now: datetime) -> float:
    if status.kind == LimitKind.JOB:
        return 0.0
    held = (
        BudgetReservation.objects.filter(team_id=status.team_id, job__state__in=ACTIVE_JOB_STATES)
        .exclude(job=job)
        .select_related("job")
    )
    if status.kind == LimitKind.MEMBER_MONTH:
        held = held.filter(job__created_by_id=status.user_id)
    return sum(held_usd(r, now=now) for r in held)


def estimate_blocker(job: Job, estimate_usd: float, *, now: datetime) -> str | None:
    """Why spending ESTIMATE_USD more on JOB would cross a limit (with the numbers), else None.
    Counts budget other active jobs have reserved."""
    for status in statuses_for_job(job, now=now):
        held = _held_by_others(status, job, now=now)
        if status.spent_usd + held + estimate_usd > float(status.limit_usd):
            others = f" + ${held:.2f} reserved by running jobs" if held else ""
            return (
                f"estimated cost ${estimate_usd:.2f} would cross the {status.label}: "
                f"${status.spent_usd:.2f} spent{others}"
            )
    return None


def preflight(job: Job, *, now: datetime) -> None:
    """At submit: raise ``BudgetExceeded`` when JOB's estimated cost would cross a limit, unless
    the submitter asked to start when the budget allows (the job then waits in the queue)."""
    if job.start_when_budget_allows:
        return
    blocker = estimate_blocker(job, estimate_remaining_usd(job), now=now)
    if blocker is not None:
        raise BudgetExceeded(f"Refused: {blocker}.")


def reserve_for_rent(job: Job, *, now: datetime) -> bool:
    """In the transaction that plans JOB's rent: hold its estimated cost against the limits
    and say whether the rent may go ahead.

    The team's budget row is locked first, so of two jobs planned at once the second sees the
    first's reservation (two cannot both squeeze under the same limit). A job that does not
    fit, or is being paused, waits: it is looked at again after ``RECHECK_S``."""
    if job.budget_usd is None and not TeamBudget.objects.filter(team_id=job.team_id).exists():
        return True  # no limit applies: nothing to hold
    TeamBudget.objects.select_for_update().get_or_create(team_id=job.team_id)
    estimate = 0.0
    if BudgetPause.objects.filter(job=job, released_at=None).exists():
        blocker = "a budget pause is in progress"
    else:
        estimate = estimate_remaining_usd(job)
        blocker = estimate_blocker(job, estimate, now=now)
    if blocker is not None:
        if job.state == JobState.RECOVERING and estimate:
            _pause_instead_of_waiting(job, blocker, now=now)
        else:
            _wait_for_budget(job, blocker, now=now)
        return False
    BudgetReservation.objects.update_or_create(
        job=job,
        defaults={
            "team_id": job.team_id,
            "amount_usd": estimate,
            "spent_at_usd": job_spend(job, now=now).total,
            "created_at": now,
        },
    )
    return True


def _pause_instead_of_waiting(job: Job, why: str, *, now: datetime) -> None:
    """A job that lost its host and whose remaining run no longer fits a limit is paused, not
    left recovering with no host: it shows as paused_budget and an admin can resume it after
    raising the limit (or in a new period). It has no live attempt, so nothing to release."""
    from jobs import losses

    losses.release_job(
        job.pk,
        to=JobState.PAUSED_BUDGET,
        now=now,
        kind="budget_paused",
        reason="budget",
        message=f"paused while recovering: {why}; raise the limit and resume",
        data={"blocker": why},
    )


def _wait_for_budget(job: Job, why: str, *, now: datetime) -> None:
    from jobs import services

    Job.objects.filter(pk=job.pk).update(next_rent_at=now + timedelta(seconds=RECHECK_S))
    last = job.events.filter(kind__in=["budget_wait", "rented", "renting"]).order_by("-id").first()
    if last is None or last.kind != "budget_wait":
        services.record_event(job.pk, now=now, kind="budget_wait", message=f"waiting: {why}")


# --- Resume -----------------------------------------------------------------------------------


def resume_blocker(job: Job, *, now: datetime) -> str | None:
    """Why JOB cannot resume now, else None: a limit still reached, or the rest of the run
    estimated to cross one (the rent reservation would hold it in the queue otherwise)."""
    for status in statuses_for_job(job, now=now):
        if status.spent_usd >= float(status.limit_usd):
            return f"the {status.label} is still reached (${status.spent_usd:.2f} spent)"
    return estimate_blocker(job, estimate_remaining_usd(job), now=now)


def resume_job(job: Job, *, by: str, now: datetime) -> None:
    """Move a budget-paused JOB back to the queue; it continues from its newest checkpoint.
    Raises ``BudgetExceeded`` (with the numbers) while a limit still blocks it."""
    from jobs import renting, services

    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("team").get(pk=job.pk)
        if job.state != JobState.PAUSED_BUDGET:
            raise BudgetExceeded(f"Job {job.pk} is {job.get_state_display()}, not paused.")
        blocker = resume_blocker(job, now=now)
        if blocker is not None:
            raise BudgetExceeded(f"Cannot resume: {blocker}. Raise the limit or wait.")
        services.transition(
            job.pk,
            JobState.QUEUED,
            now=now,
            kind="budget_resumed",
            message=f"resumed by {by}",
            next_rent_at=None,
            rent_backoff_s=0,
        )
        services.after_commit(renting.plan_rent, job.pk, now=now)
