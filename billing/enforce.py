"""Budget enforcement: the decisions of one budget pass, at the watchdog's cadence (beat task
``jobs.tasks.enforce_budgets``) and once when a worker starts. Billing decides and keeps its
own rows (warnings, pauses); ``jobs.lifecycle.enforce_budgets`` claims each step and acts on
what it returns (events, checkpoint requests, the pause itself).

Each pass, for every team with active jobs: every limit that applies (team periods, members,
jobs) is measured from recorded spend (``billing.services``). At 80 % a warning is written once
per limit and period (``BudgetWarning`` keyed by both) with a ``budget_warning`` event on the
affected jobs. A job is stopped so that its last checkpoint is uploaded just before the money
runs out:

1. ``start_pause``: once the limit will be reached within the job's checkpoint lead plus two
   intervals (the next pass would ask too late), a ``BudgetPause`` opens with a deadline: one
   interval before the projected crossing, the last pass that releases before the money runs
   out (at once when the limit is already crossed), and the agent, if it trains, is asked for
   a checkpoint (``checkpoint_now``). The lead (``checkpoint_lead_s``) is how long asking
   takes: the heartbeat that carries the request, a step, and the slowest of this job's recent
   uploads (``Checkpoint`` created → ready), with a margin; ``BUDGET_CHECKPOINT_GRACE_S``
   until an upload of the job was measured.
2. ``finish_pauses``, every pass (``pause_action``): at the deadline the machine is released,
   checkpoint or not. Before it the job trains on and is asked for a checkpoint at the last
   pass that can still get one in; once the one asked for has arrived, the machine is
   released if no later one could arrive in time, so the checkpoint kept is the one nearest
   the deadline. An early checkpoint (the first ask of a job with no measured upload) does
   not end the run, and the machine is never released early with less than half the
   attempt's money used. A pass that sees spend jump (a traffic burst) brings the deadline
   forward. Release is a ``BudgetAction`` with ``pause``: the job is paused_budget with an
   event naming the limit. A job without a host (renting, recovering) is paused at once; a
   queued one is left waiting: the rent reservation keeps it from starting until the budget
   allows (a new period, a raised limit).

Every step is a guarded claim (unique open pause per job, warning keys, guarded transitions),
so two enforcers at once, or a tick repeated after a worker restart, do nothing twice. Spend
is recomputed from the attempts each time, never accrued, so nothing counts twice either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings

from billing.models import BudgetPause, BudgetReservation, BudgetWarning, LimitKind
from billing.services import (
    ACTIVE_JOB_STATES,
    WARN_AT,
    LimitStatus,
    job_limit_status,
    team_limit_statuses,
)
from billing.spend import job_spend
from jobs.models import ON_HOST_STATES, Attempt, AttemptState, Checkpoint, Job
from jobs.spending import BudgetAction, BudgetStep
from nomadgpu.models import Team

logger = logging.getLogger(__name__)

RELEASE, ASK, WAIT = "release", "ask", "wait"
NOT_ASKED, ASKED, ARRIVED = "not asked", "asked", "arrived"
# On top of the measured time: uploads vary, and saving (before the upload) is not measured.
LEAD_MARGIN = 0.5
AGENT_SCAN_S = 1.0  # the agent looks for newly ready checkpoints every second
RECENT_UPLOADS = 3
MAX_LEAD_S = 3600.0


def interval_s() -> float:
    """Seconds between enforcement passes."""
    return float(settings.WATCHDOG_INTERVAL_S)


def grace_s() -> float:
    """The checkpoint lead of a job none of whose uploads was measured yet."""
    return float(settings.BUDGET_CHECKPOINT_GRACE_S)


def budget_pass(*, now: datetime) -> Iterator[BudgetStep]:
    """The steps of one enforcement pass at NOW, in order: open pauses first (a release frees
    budget for the rest), then per team every limit near or past its mark, then the pauses
    again (one just begun for a job with no host is released in the same pass)."""
    yield from pause_steps(now=now)
    widest = max(MAX_LEAD_S, grace_s())  # most limits are far away: no per-job look at all
    for team in Team.objects.filter(jobs__state__in=ACTIVE_JOB_STATES).distinct():
        for status in statuses_to_check(team, now=now):
            if status.ratio >= WARN_AT:
                yield BudgetStep("warned", partial(warn_once, status, now=now))
            if must_stop(status, lead_s=widest):
                for job_id in list(status.affected_jobs(started_only=True)):
                    if stop_in_time(job_id, status, now=now):
                        yield BudgetStep("pausing", partial(start_pause, job_id, status, now=now))
    yield from pause_steps(now=now)


def statuses_to_check(team: Team, *, now: datetime) -> list[LimitStatus]:
    """The limits of TEAM's active jobs: the team's, their submitters', their own."""
    active = Job.objects.filter(team=team, state__in=ACTIVE_JOB_STATES)
    users = set(active.values_list("created_by_id", flat=True))
    found = team_limit_statuses(team, now=now, users=users)
    for job in active.exclude(budget_usd=None):
        found.append(job_limit_status(job, now=now))
    return found


def must_stop(status: LimitStatus, *, lead_s: float) -> bool:
    """The limit is reached, or will be before a checkpoint asked at the next pass could arrive:
    within LEAD_S plus two intervals (the next pass, the deadline's) at the scope's burn."""
    ahead_h = (lead_s + 2 * interval_s()) / 3600.0
    return status.spent_usd + status.rate_usd_per_h * ahead_h >= float(status.limit_usd)


def seconds_to_limit(status: LimitStatus) -> float:
    """Seconds until the scope's spend reaches the limit at its current burn rate."""
    left = float(status.limit_usd) - status.spent_usd
    if left <= 0:
        return 0.0
    if status.rate_usd_per_h <= 0:
        return float("inf")
    return left / status.rate_usd_per_h * 3600.0


def pause_deadline(status: LimitStatus, *, now: datetime) -> datetime | None:
    """When the machine is released at the latest: one interval before the projected crossing,
    so the pass that releases it comes before the money runs out. A limit already crossed (a
    traffic burst jumped past it, typically a model download at start, before any checkpoint)
    is released in the same pass: the limit is hard, and the job resumes from its newest ready
    checkpoint. None when the scope burns nothing (no crossing ahead)."""
    to_limit = seconds_to_limit(status)
    if to_limit == float("inf"):
        return None
    return now + timedelta(seconds=max(to_limit - interval_s(), 0.0))


def checkpoint_lead_s(
    uploads_s: Sequence[float], *, heartbeat_s: float, seconds_per_step: float
) -> float:
    """Seconds from asking for a checkpoint until it is ready: the heartbeat that carries the
    request, the step the script finishes first and the slowest of UPLOADS_S (the job's recent
    uploads), with ``LEAD_MARGIN`` on top, and the agent's scan. The grace while nothing was
    measured; never more than ``MAX_LEAD_S``."""
    if not uploads_s:
        return grace_s()
    measured = heartbeat_s + seconds_per_step + max(uploads_s)
    return min(measured * (1 + LEAD_MARGIN) + AGENT_SCAN_S, MAX_LEAD_S)


def recent_uploads_s(job_id: int) -> list[float]:
    """How long the job's newest ``RECENT_UPLOADS`` uploads took."""
    return Checkpoint.objects.filter(job_id=job_id).upload_seconds(RECENT_UPLOADS)


def job_lead_s(job_id: int) -> float:
    """``checkpoint_lead_s`` of JOB_ID, from its uploads, heartbeat and live attempt's pace."""
    heartbeat_s = Job.objects.values_list("heartbeat_interval_s", flat=True).get(pk=job_id)
    live = Attempt.objects.filter(job_id=job_id, state=AttemptState.RUNNING)
    seconds_per_step = live.values_list("seconds_per_step", flat=True).first() or 0.0
    return checkpoint_lead_s(
        recent_uploads_s(job_id), heartbeat_s=heartbeat_s, seconds_per_step=seconds_per_step
    )


def pause_action(
    *,
    now: datetime,
    started_at: datetime,
    deadline: datetime,
    lead_s: float,
    checkpoint: str,
    asked_at: datetime | None = None,
) -> str:
    """What an open pause does at NOW: ``RELEASE`` the machine, ``ASK`` for a checkpoint, or
    ``WAIT``. STARTED_AT is when the attempt began to spend, LEAD_S what a checkpoint takes
    (``checkpoint_lead_s``), CHECKPOINT where the last request stands: ``NOT_ASKED`` (the job
    was not training yet), ``ASKED`` (on its way) or ``ARRIVED``.

    The deadline releases whatever the job has (it may never checkpoint). Before it, the job
    trains on and is asked at the last pass that can still get a checkpoint in before the
    deadline; once the one asked for has arrived it is released when no later one could arrive
    in time, but never with less than half the attempt's time until the money runs out (an
    interval after the deadline) used: then it is asked again instead. Nor when the checkpoint
    in hand answered an early request (ASKED_AT, the last one, came before that last pass):
    a pass that came late, as on a loaded worker, would otherwise release the machine with all
    the work since then lost; a request now may still arrive before the deadline."""
    if now >= deadline:
        return RELEASE
    if checkpoint == ASKED:
        return WAIT
    lead = timedelta(seconds=lead_s)
    interval = timedelta(seconds=interval_s())
    if checkpoint == ARRIVED and now + lead > deadline:
        if asked_at is not None and asked_at + lead + interval < deadline:
            return ASK  # what we hold is old: a late request beats none
        runs_out = deadline + interval
        return RELEASE if now - started_at >= (runs_out - started_at) / 2 else ASK
    if now + lead + interval >= deadline:
        return ASK  # the next pass would ask too late
    return WAIT


def warn_once(status: LimitStatus, *, now: datetime) -> list[BudgetAction]:
    """Claim the 80 % warning of STATUS's limit and period (once: another pass writing the same
    key first makes this one roll back); a ``budget_warning`` event on each affected job."""
    _, created = BudgetWarning.objects.get_or_create(
        key=f"{status.key()}:{status.limit_usd}",
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
        return []
    message = f"{status.ratio:.0%} of the {status.label} used (${status.spent_usd:.2f})"
    data = {
        "limit": status.kind,
        "limit_usd": float(status.limit_usd),
        "spent_usd": round(status.spent_usd, 4),
    }
    return [
        BudgetAction(job_id, event="budget_warning", message=message, data=data)
        for job_id in status.affected_jobs()
    ]


def stop_in_time(job_id: int, status: LimitStatus, *, now: datetime) -> bool:
    """Whether JOB_ID's pause must begin now: STATUS's limit is within the job's checkpoint
    lead and no pause is open. An open pause's deadline is brought forward when spend jumped."""
    deadline = pause_deadline(status, now=now)
    open_pause = BudgetPause.objects.filter(job_id=job_id, released_at=None)
    if deadline is not None:
        open_pause.filter(deadline__gt=deadline).update(deadline=deadline)
    return not open_pause.exists() and must_stop(status, lead_s=job_lead_s(job_id))


def start_pause(job_id: int, status: LimitStatus, *, now: datetime) -> list[BudgetAction]:
    """Begin stopping JOB_ID for STATUS's limit: open a pause with a deadline and ask a training
    agent for a checkpoint (one still starting is asked once it trains); a job with no host
    is released at once."""
    job = Job.objects.select_for_update().filter(pk=job_id, state__in=ACTIVE_JOB_STATES[1:])
    if not job.exists() or BudgetPause.objects.filter(job_id=job_id, released_at=None).exists():
        return []
    live = Attempt.objects.filter(job_id=job_id, state__in=ON_HOST_STATES).first()
    training = live is not None and live.state == AttemptState.RUNNING
    pause = BudgetPause.objects.create(
        job_id=job_id,
        attempt=live,
        limit=status.kind,
        limit_usd=status.limit_usd,
        spent_usd=status.spent_usd,
        period_start=status.period_start,
        requested_at=now,
        asked_at=now if training else None,
        deadline=(pause_deadline(status, now=now) or now) if live else now,
        checkpoint_step=Checkpoint.objects.filter(job_id=job_id).newest_ready_step(),
    )
    if live is None:
        return release(pause, now=now)
    message = (
        f"{status.describe()}: checkpoint asked before releasing the machine"
        if training
        else f"{status.describe()}: checkpoint to be asked once training starts"
    )
    return [
        BudgetAction(
            job_id,
            event="budget_checkpoint",
            message=message,
            ask_attempt_id=live.pk if training else None,
        )
    ]


def checkpoint_state(pause: BudgetPause) -> str:
    """Where PAUSE's last checkpoint request stands: ``NOT_ASKED``, ``ASKED`` or ``ARRIVED``
    (a checkpoint newer than the request became ready)."""
    if pause.asked_at is None:
        return NOT_ASKED
    newer = Checkpoint.objects.filter(job_id=pause.job_id, ready_at__gte=pause.asked_at).ready()
    if pause.checkpoint_step is not None:
        newer = newer.filter(step__gt=pause.checkpoint_step)
    return ARRIVED if newer.exists() else ASKED


def pause_steps(*, now: datetime) -> Iterator[BudgetStep]:
    """A step for every open pause whose ``pause_action`` is to release its machine or ask for
    a checkpoint (once the job trains)."""
    for pause in BudgetPause.objects.filter(released_at=None).select_related("attempt"):
        action = RELEASE if pause.deadline <= now else _action(pause, now=now)
        if action == RELEASE:
            yield BudgetStep("released", partial(release, pause, now=now))
        elif action == ASK:
            yield BudgetStep("asked", partial(ask_for_checkpoint, pause, now=now))


def _action(pause: BudgetPause, *, now: datetime) -> str:
    attempt = pause.attempt
    started = (attempt.registered_at or attempt.rented_at) if attempt else None
    return pause_action(
        now=now,
        started_at=min(started or pause.requested_at, pause.requested_at),
        deadline=pause.deadline,
        lead_s=job_lead_s(pause.job_id),
        checkpoint=checkpoint_state(pause),
        asked_at=pause.asked_at,
    )


def ask_for_checkpoint(pause: BudgetPause, *, now: datetime) -> list[BudgetAction]:
    """Ask PAUSE's agent for a checkpoint now (nearer the deadline than any before), if it
    trains: an agent still starting has no script to signal yet."""
    if pause.attempt is None or pause.attempt.state != AttemptState.RUNNING:
        return []
    newest = Checkpoint.objects.filter(job_id=pause.job_id).newest_ready_step()
    claim = BudgetPause.objects.filter(pk=pause.pk, released_at=None, asked_at=pause.asked_at)
    if not claim.update(asked_at=now, checkpoint_step=newest):
        return []  # another enforcer asked first
    logger.info(
        "job %s: checkpoint asked, %s before the deadline", pause.job_id, pause.deadline - now
    )
    return [BudgetAction(pause.job_id, ask_attempt_id=pause.attempt_id)]


def release(pause: BudgetPause, *, now: datetime) -> list[BudgetAction]:
    """Close PAUSE: the job is to go paused_budget, naming the limit, and its machine to be
    released. A job that ended meanwhile (finished, cancelled) is left as it is."""
    if not BudgetPause.objects.filter(pk=pause.pk, released_at=None).update(released_at=now):
        return []
    BudgetReservation.objects.filter(job_id=pause.job_id).delete()
    job = Job.objects.select_for_update().get(pk=pause.job_id)
    if job.state not in ACTIVE_JOB_STATES:
        return []  # finished, failed or cancelled meanwhile: nothing to release
    step = Checkpoint.objects.filter(job=job).newest_ready_step()
    spent = job_spend(job, now=now).total
    label = f"{LimitKind(pause.limit).label} limit ${pause.limit_usd}"
    logger.info("job %s paused by the %s", pause.job_id, label)
    message = (
        f"paused by the {label}: machine released, progress kept at checkpoint "
        f"{step} (job spend ${spent:.4f})"
    )
    data = {
        "limit": pause.limit,
        "limit_usd": float(pause.limit_usd),
        "spent_usd": round(pause.spent_usd, 4),
        "job_spend_usd": round(spent, 4),
        "checkpoint_step": step,
    }
    return [BudgetAction(job.pk, message=message, data=data, pause=True)]
