"""Budget enforcement, at the watchdog's cadence (beat task ``billing.tasks.enforce_budgets``)
and once when a worker starts.

Each pass, for every team with active jobs: every limit that applies (team periods, members,
jobs) is measured from recorded spend (``billing.services``). At 80 % a warning is written once
per limit and period (``BudgetWarning`` keyed by both) with a ``budget_warning`` event on the
affected jobs. A job is stopped in two steps:

1. ``start_pause``: when the limit is reached, or will be within one checkpoint grace plus one
   interval at the current burn rate, the agent is asked for a checkpoint (``checkpoint_now``)
   and a ``BudgetPause`` opens with a deadline: the grace, cut short to one interval before
   the projected crossing (at once when the limit is already crossed). Asking ahead is what
   keeps the overshoot small: by the time the money runs out the checkpoint is usually uploaded.
2. ``finish_pauses``: once a checkpoint newer than the pause is ready, or the deadline passes,
   the machine is released through ``jobs.losses.release_job`` and the job is paused_budget
   with an event naming the limit. A started job without a training host (renting,
   recovering) is paused at once; a queued one is left waiting: the rent reservation keeps it
   from starting until the budget allows (a new period, a raised limit).

Every step is a guarded claim (unique open pause per job, warning keys, guarded transitions),
so two enforcers at once, or a tick repeated after a worker restart, do nothing twice. Spend
is recomputed from the attempts each time, never accrued, so nothing counts twice either.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from billing.models import BudgetPause, BudgetReservation, BudgetWarning, LimitKind
from billing.services import (
    ACTIVE_JOB_STATES,
    WARN_AT,
    LimitStatus,
    job_limit_status,
    team_limit_statuses,
)
from billing.spend import job_spend
from jobs import losses, services
from jobs.models import Attempt, AttemptState, Checkpoint, Job, JobState
from nomadgpu.models import Team

logger = logging.getLogger(__name__)


def interval_s() -> float:
    return float(settings.WATCHDOG_INTERVAL_S)


def grace_s() -> float:
    return float(settings.BUDGET_CHECKPOINT_GRACE_S)


def enforce_budgets(*, now: datetime) -> dict:
    """One enforcement pass at NOW; says how many warnings, pauses begun and machines released."""
    released = finish_pauses(now=now)
    warned = started = 0
    for team in Team.objects.filter(jobs__state__in=ACTIVE_JOB_STATES).distinct():
        for status in statuses_to_check(team, now=now):
            if status.ratio >= WARN_AT:
                warned += warn_once(status, now=now)
            if must_stop(status):
                for job_id in list(status.affected_jobs(started_only=True)):
                    started += start_pause(job_id, status, now=now)
    released += finish_pauses(now=now)
    return {"warned": warned, "pausing": started, "released": released}


def statuses_to_check(team: Team, *, now: datetime) -> list[LimitStatus]:
    """The limits of TEAM's active jobs: the team's, their submitters', their own."""
    active = Job.objects.filter(team=team, state__in=ACTIVE_JOB_STATES)
    users = set(active.values_list("created_by_id", flat=True))
    found = team_limit_statuses(team, now=now, users=users)
    for job in active.exclude(budget_usd=None):
        found.append(job_limit_status(job, now=now))
    return found


def must_stop(status: LimitStatus) -> bool:
    """The limit is reached, or will be before a checkpoint asked now could be uploaded (one
    grace) and the next pass seen (one interval), at the scope's current burn rate."""
    ahead_h = (grace_s() + interval_s()) / 3600.0
    return status.spent_usd + status.rate_usd_per_h * ahead_h >= float(status.limit_usd)


def seconds_to_limit(status: LimitStatus) -> float:
    """Seconds until the scope's spend reaches the limit at its current burn rate."""
    left = float(status.limit_usd) - status.spent_usd
    if left <= 0:
        return 0.0
    if status.rate_usd_per_h <= 0:
        return float("inf")
    return left / status.rate_usd_per_h * 3600.0


def pause_deadline(status: LimitStatus, *, now: datetime) -> datetime:
    """When the machine is released at the latest: after the grace, or one interval before the
    projected crossing if that is sooner. A limit already crossed (a traffic burst jumped past
    it, typically a model download at start, before any checkpoint) is released in the same
    pass: the limit is hard, and the job resumes from its newest ready checkpoint."""
    to_limit = seconds_to_limit(status)
    wait = 0.0 if to_limit <= 0 else min(grace_s(), max(to_limit - interval_s(), 0.0))
    return now + timedelta(seconds=wait)


def warn_once(status: LimitStatus, *, now: datetime) -> int:
    """Record the 80 % warning of STATUS's limit and period once; events on the affected jobs."""
    key = f"{status.key()}:{status.limit_usd}"
    try:
        with transaction.atomic():
            _, created = BudgetWarning.objects.get_or_create(
                key=key,
                defaults={
                    "team_id": status.team_id,
                    "limit": status.kind,
                    "job_id": status.job_id,
                    "user_id": status.user_id,
                    "period_start": status.period_start,
                    "period_end": status.period_end,
                    "limit_usd": status.limit_usd,
                    "spent_usd": status.spent_usd,
                    "created_at": now,
                },
            )
            if not created:
                return 0
            for job_id in status.affected_jobs():
                services.record_event(
                    job_id,
                    now=now,
                    kind="budget_warning",
                    message=f"{status.ratio:.0%} of the {status.label} used "
                    f"(${status.spent_usd:.2f})",
                    limit=status.kind,
                    limit_usd=float(status.limit_usd),
                    spent_usd=round(status.spent_usd, 4),
                )
    except IntegrityError:
        return 0  # another enforcer wrote it first
    return 1


def start_pause(job_id: int, status: LimitStatus, *, now: datetime) -> int:
    """Begin stopping JOB_ID for STATUS's limit: ask its agent for a checkpoint and open a
    pause with a deadline; a job with no training host is released at once. 1 if begun."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, state__in=ACTIVE_JOB_STATES[1:])
        if not job.exists() or BudgetPause.objects.filter(job_id=job_id, released_at=None).exists():
            return 0
        live = Attempt.objects.filter(job_id=job_id, state=AttemptState.RUNNING).first()
        pause = BudgetPause.objects.create(
            job_id=job_id,
            attempt=live,
            limit=status.kind,
            limit_usd=status.limit_usd,
            spent_usd=status.spent_usd,
            period_start=status.period_start,
            requested_at=now,
            deadline=pause_deadline(status, now=now) if live else now,
            checkpoint_step=newest_ready_step(job_id),
        )
        if live is not None:
            # "stop" (a fenced agent) must not be replaced by a checkpoint request.
            Attempt.objects.filter(pk=live.pk, pending_command="").update(
                pending_command="checkpoint_now"
            )
            services.record_event(
                job_id,
                now=now,
                kind="budget_checkpoint",
                message=f"{status.describe()}: checkpoint asked before releasing the machine",
            )
    if live is None:
        release(pause, now=now)
    return 1


def newest_ready_step(job_id: int) -> int | None:
    return (
        Checkpoint.objects.filter(job_id=job_id, state="ready")
        .order_by("-step")
        .values_list("step", flat=True)
        .first()
    )


def checkpoint_arrived(pause: BudgetPause) -> bool:
    """A checkpoint newer than the pause's request became ready."""
    newer = Checkpoint.objects.filter(
        job_id=pause.job_id, state="ready", ready_at__gte=pause.requested_at
    )
    if pause.checkpoint_step is not None:
        newer = newer.filter(step__gt=pause.checkpoint_step)
    return newer.exists()


def finish_pauses(*, now: datetime) -> int:
    """Release the machines of open pauses whose checkpoint arrived or deadline passed."""
    released = 0
    for pause in BudgetPause.objects.filter(released_at=None).select_related("job"):
        if pause.deadline <= now or checkpoint_arrived(pause):
            released += release(pause, now=now)
    return released


def release(pause: BudgetPause, *, now: datetime) -> int:
    """Close PAUSE: the job goes paused_budget, naming the limit; its machine is destroyed after
    commit. A job that ended meanwhile (finished, cancelled) is left as it is."""
    with transaction.atomic():
        if not BudgetPause.objects.filter(pk=pause.pk, released_at=None).update(released_at=now):
            return 0
        BudgetReservation.objects.filter(job_id=pause.job_id).delete()
        job = Job.objects.select_for_update().get(pk=pause.job_id)
        if job.state not in ACTIVE_JOB_STATES:
            return 0  # finished, failed or cancelled meanwhile: nothing to release
        step = newest_ready_step(job.pk)
        spent = job_spend(job, now=now).total
        label = f"{LimitKind(pause.limit).label} limit ${pause.limit_usd}"
        losses.release_job(
            job.pk,
            to=JobState.PAUSED_BUDGET,
            now=now,
            kind="budget_paused",
            reason="budget",
            message=f"paused by the {label}: machine released, progress kept at checkpoint "
            f"{step} (job spend ${spent:.4f})",
            data={
                "limit": pause.limit,
                "limit_usd": float(pause.limit_usd),
                "spent_usd": round(pause.spent_usd, 4),
                "job_spend_usd": round(spent, 4),
                "checkpoint_step": step,
            },
        )
    logger.info("job %s paused by the %s", pause.job_id, label)
    return 1
