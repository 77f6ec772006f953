"""Spending limits: where each limit stands, and the verdicts at submit (pre-flight), when a
rent is planned (the reservation) and at resume. Enforcement is ``billing.enforce``. Billing
decides; ``jobs.lifecycle`` acts (``billing.gate`` answers its questions).

Limits (``LimitKind``): the job's own ``Job.budget_usd`` over its whole life; the team's
daily, weekly (from Monday) and monthly limits over calendar periods in the team's time zone;
the per-member monthly limit over the jobs a member submitted. Spend comes from the attempts'
recorded rates (``billing.spend``), clipped to each period.

The pre-flight estimate is the selection's cost model (``hosts.selection.estimate_cost``)
before any market search (``jobs.renting.reference.reference_cost``: the cheapest of the offers
the newest rent of the job's shape weighed, priced again with what is measured now; else the
host its rents paid for; else the profile's reference GPU at ``BUDGET_ESTIMATE_DPH`` $/h per
GPU): submitting must not depend on the provider answering, and the cheapest host is not
known until the rent. The job's terms come
from the same translation the rent uses (``reference.estimate_for``: ``requirements_for``,
``profile_for`` corrected by what the shape's runs measured, ``jobs.renting.shape_history``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import F, Q, Value
from django.db.models.functions import Greatest

from billing import next_steps
from billing.models import BudgetPause, BudgetReservation, LimitKind, TeamBudget
from billing.periods import period_bounds
from billing.spend import burn_rate_per_hour, job_spend, spend_between
from jobs.models import ACTIVE_STATES, Attempt, Job, JobState
from jobs.rent_decision import RentDecision
from jobs.renting.reference import estimate_for
from jobs.spending import ALLOW, Verdict
from jobs.stored_spec import StoredSpecInvalid
from nomadgpu.humanize import money, share

WARN_AT = 0.8
# A job waiting for budget (queued to start when it allows, or refused a rent) looks again
# this often: a new period or a raised limit is picked up within a minute.
RECHECK_S = 60


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
        """ "daily limit $0.0800" (``limit_label``)."""
        return limit_label(self.kind, self.limit_usd)

    def key(self) -> str:
        """Names this limit in this period (one warning each)."""
        who = self.job_id if self.kind == LimitKind.JOB else self.user_id or ""
        return f"{self.team_id}:{self.kind}:{who}:{self.period_start.isoformat()}"

    def affected_jobs(self, *, started_only: bool = False) -> Iterable[int]:
        """Ids of the active jobs under this limit; STARTED_ONLY leaves out queued jobs (they
        hold no machine, and the rent reservation keeps them waiting until the budget allows)."""
        jobs = Job.objects.started() if started_only else Job.objects.active()
        jobs = jobs.filter(team_id=self.team_id)
        if self.kind == LimitKind.JOB:
            jobs = jobs.filter(pk=self.job_id)
        elif self.kind == LimitKind.MEMBER_MONTH:
            jobs = jobs.filter(created_by_id=self.user_id)
        return jobs.values_list("pk", flat=True)

    def describe(self) -> str:
        """ "daily limit $0.0800: $0.0792 spent (99 %)", the share computed from the amounts
        as written (``humanize.share``)."""
        spent = money(self.spent_usd)
        return f"{self.label}: {spent} spent ({share(self.spent_usd, self.limit_usd)})"

    def used(self) -> str:
        """ "99 % of the daily limit $0.0800 used ($0.0792)": the warning's sentence."""
        pct = share(self.spent_usd, self.limit_usd)
        return f"{pct} of the {self.label} used ({money(self.spent_usd)})"


def limit_label(kind: str, limit_usd) -> str:
    """A limit as messages and the banner name it: "daily limit $0.0800", "job limit $1.00"."""
    return f"{LimitKind(kind).label} limit {money(limit_usd)}"


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


def limit_now(job: Job, kind: str, *, now: datetime) -> LimitStatus | None:
    """Where JOB's limit of KIND stands at NOW (the per-member one: its submitter's); None
    when that limit is not set (any more)."""
    return next((s for s in statuses_for_job(job, now=now) if s.kind == kind), None)


# --- Estimates, pre-flight and reservations ----------------------------------------------------


def estimate_remaining_usd(job: Job) -> float:
    """The selection's cost model for the rest of JOB on the reference host, with what its
    shape's earlier runs measured (module docstring)."""
    return estimate_for(job).total_usd


def projected_total(job, *, now: datetime) -> float | None:
    """Dollars JOB will have cost when it finishes: spend so far plus the rest of the run.

    The rest is priced with the live attempt's rates and speed (observed seconds per step,
    else the selection decision's estimate) for the steps still ahead, plus the decision's
    upload cost for that share. Without a live attempt (queued, paused) the rest comes from
    ``estimate_remaining_usd``, the same estimate the pre-flight uses; None when the job's
    stored spec no longer validates (nothing prices the rest until it is fixed).
    """
    so_far = job_spend(job, now=now).total
    if job.state in ("succeeded", "failed", "cancelled"):
        return so_far
    live = job.attempts.live().exclude(rented_at=None).order_by("-number").first()
    if live is None:
        try:
            return so_far + estimate_remaining_usd(job)
        except StoredSpecInvalid:
            return None
    planned = RentDecision.of(live)
    spp = live.seconds_per_step or planned.seconds_per_step or 0.0
    total_steps = job.total_steps or live.total_steps or 0
    left = max(total_steps - (live.step or live.resumed_from_step or 0), 0)
    rate = live.dph_base + live.storage_usd_per_gb_hour * live.disk_gb
    planned_steps = planned.steps_planned
    upload = planned.upload_usd * (left / planned_steps if planned_steps else 0.0)
    return so_far + rate * left * spp / 3600.0 + upload


def held_usd(reservation: BudgetReservation, *, now: datetime) -> float:
    """What RESERVATION still holds: its estimate minus what the job spent since."""
    spent_since = job_spend(reservation.job, now=now).total - reservation.spent_at_usd
    return max(reservation.amount_usd - spent_since, 0.0)


def _held_by_others(status: LimitStatus, job: Job, *, now: datetime) -> float:
    if status.kind == LimitKind.JOB:
        return 0.0
    held = (
        BudgetReservation.objects.filter(team_id=status.team_id, job__state__in=ACTIVE_STATES)
        .exclude(job=job)
        .select_related("job")
    )
    if status.kind == LimitKind.MEMBER_MONTH:
        held = held.filter(job__created_by_id=status.user_id)
    return sum(held_usd(r, now=now) for r in held)


def blocking_limit(
    job: Job, estimate_usd: float, *, now: datetime
) -> tuple[LimitStatus, str] | None:
    """The first limit that spending ESTIMATE_USD more on JOB would cross, and why (with the
    numbers), else None. Counts budget other active jobs have reserved."""
    for status in statuses_for_job(job, now=now):
        held = _held_by_others(status, job, now=now)
        if status.spent_usd + held + estimate_usd > float(status.limit_usd):
            others = f" + {money(held)} reserved by running jobs" if held else ""
            return status, (
                f"estimated cost {money(estimate_usd)} would cross the {status.label}: "
                f"{money(status.spent_usd)} spent{others}"
            )
    return None


def estimate_blocker(job: Job, estimate_usd: float, *, now: datetime) -> str | None:
    """Why spending ESTIMATE_USD more on JOB would cross a limit (``blocking_limit``), else None."""
    found = blocking_limit(job, estimate_usd, now=now)
    return None if found is None else found[1]


def preflight(job: Job, *, now: datetime) -> Verdict:
    """At submit: refused when JOB's estimated cost would cross a limit, unless the submitter
    asked to start when the budget allows (the job then waits in the queue). The refusal says
    what can be done about it (``billing.next_steps.submit_refusal``)."""
    if job.start_when_budget_allows:
        return ALLOW
    estimate = estimate_remaining_usd(job)
    found = blocking_limit(job, estimate, now=now)
    if found is None:
        return ALLOW
    status, blocker = found
    reason = f"Refused: {blocker}. {next_steps.submit_refusal(status, estimate, job.team, now=now)}"
    return Verdict(allowed=False, reason=reason)


def reserve_for_rent(job: Job, *, now: datetime) -> Verdict:
    """In the transaction that plans JOB's rent: hold its estimated cost against the limits
    and say whether the rent may go ahead.

    The team's budget row is locked first, so of two jobs planned at once the second sees the
    first's reservation (two cannot both squeeze under the same limit). A job that does not
    fit, or is being paused, waits and is looked at again after ``RECHECK_S``; one that lost
    its host and no longer fits is to be paused instead (it has no machine to keep)."""
    if job.budget_usd is None and not TeamBudget.objects.filter(team_id=job.team_id).exists():
        return ALLOW  # no limit applies: nothing to hold
    TeamBudget.objects.select_for_update().get_or_create(team_id=job.team_id)
    estimate = 0.0
    if BudgetPause.objects.filter(job=job, released_at=None).exists():
        blocker = "a budget pause is in progress"
    else:
        estimate = estimate_remaining_usd(job)
        blocker = estimate_blocker(job, estimate, now=now)
    if blocker is not None:
        pause = job.state == JobState.RECOVERING and bool(estimate)
        return Verdict(allowed=False, reason=blocker, pause=pause, retry_after_s=RECHECK_S)
    BudgetReservation.objects.update_or_create(
        job=job,
        defaults={
            "team_id": job.team_id,
            "amount_usd": estimate,
            "spent_at_usd": job_spend(job, now=now).total,
            "created_at": now,
        },
    )
    return ALLOW


def reserve_for_racer(job: Job, *, amount_usd: float, now: datetime) -> Verdict:
    """Before a racer of JOB's hedged rent is created (``jobs.renting.race``): hold AMOUNT_USD,
    what it costs should it lose, on top of what the job holds already, or refuse it when that
    would cross a limit (the race then has one racer fewer). Locked as the rent's reservation."""
    if job.budget_usd is None and not TeamBudget.objects.filter(team_id=job.team_id).exists():
        return ALLOW
    TeamBudget.objects.select_for_update().get_or_create(team_id=job.team_id)
    reservation = BudgetReservation.objects.filter(job=job).first()
    own = held_usd(reservation, now=now) if reservation else 0.0
    blocker = estimate_blocker(job, own + amount_usd, now=now)
    if blocker is not None:
        return Verdict(allowed=False, reason=blocker, retry_after_s=RECHECK_S)
    if reservation is None:
        BudgetReservation.objects.create(
            job=job,
            team_id=job.team_id,
            amount_usd=amount_usd,
            spent_at_usd=job_spend(job, now=now).total,
            created_at=now,
        )
    else:
        BudgetReservation.objects.filter(pk=reservation.pk).update(
            amount_usd=F("amount_usd") + amount_usd
        )
    return ALLOW


def release_racer(job: Job, *, reserved_usd: float, spent_usd: float, now: datetime) -> None:
    """A racer of JOB left its race: the RESERVED_USD it held goes, and the SPENT_USD it cost
    (already in the job's spend) no longer eats into what the rest of the run holds."""
    BudgetReservation.objects.filter(job=job).update(
        amount_usd=Greatest(F("amount_usd") - reserved_usd, Value(0.0)),
        spent_at_usd=F("spent_at_usd") + spent_usd,
    )


# --- Resume -----------------------------------------------------------------------------------


def resume_limit(job: Job, *, now: datetime) -> tuple[LimitStatus, str] | None:
    """The limit that keeps JOB from resuming now, and why, else None: a limit still reached,
    or the rest of the run estimated to cross one (the rent reservation would hold it in the
    queue otherwise)."""
    for status in statuses_for_job(job, now=now):
        if status.spent_usd >= float(status.limit_usd):
            return status, f"the {status.label} is still reached ({money(status.spent_usd)} spent)"
    return blocking_limit(job, estimate_remaining_usd(job), now=now)


def resume_blocker(job: Job, *, now: datetime) -> str | None:
    """Why JOB cannot resume now (``resume_limit``), else None."""
    found = resume_limit(job, now=now)
    return None if found is None else found[1]


def resume_verdict(job: Job, *, now: datetime) -> Verdict:
    """May the budget-paused JOB go back to the queue (``resume_blocker``)?"""
    blocker = resume_blocker(job, now=now)
    return ALLOW if blocker is None else Verdict(allowed=False, reason=blocker)
