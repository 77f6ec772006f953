"""Budget enforcement: one budget pass (``budget_pass``), read from top to bottom here. It runs
at the watchdog's cadence (beat ``budget-enforce``, task ``billing.tasks.enforce_budgets``) and
once when a worker starts (``billing.apps``). Billing sits above jobs: each step claims
billing's own rows (warnings, pauses) and calls the job's transitions in ``jobs.lifecycle``
(``record_event``, ``request_checkpoint``, ``pause_for_budget``) in the same transaction.

Each pass, for every team with active jobs: every limit that applies (team periods, members,
jobs) is measured from recorded spend (``billing.services``). At 80 % a warning is written once
per limit and period (``BudgetWarning`` keyed by both) with a ``budget_warning`` event on the
affected jobs. A job is stopped so that its last checkpoint is uploaded just before the money
runs out:

1. ``start_pause``: once the limit will be reached within the job's checkpoint lead plus two
   intervals (the next pass would ask too late), a ``BudgetPause`` opens with a deadline: one
   interval before the projected crossing, the last pass that releases before the money runs
   out (at once when the limit is already crossed; when recent passes came late, the longest
   gap between them instead of the interval, ``pass_gap_s``), and the agent, if it trains, is
   asked for a checkpoint (``checkpoint_now``). The lead (``checkpoint_lead_s``) is how long asking
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
   forward. At release the job goes paused_budget (``lifecycle.pause_for_budget``) with an
   event naming the limit and the share it fired at: short of 100 % by design, the release
   being a pass or more before the crossing ("paused at 99 % of the daily limit $0.0800
   ($0.0792 spent), before it is crossed"). A job without a host is paused at once; a queued
   one waits: its rent reservation holds it until the budget allows (a period, a raise).

Every step is a guarded claim (unique open pause per job, warning keys, guarded transitions),
so two enforcers at once, or a tick repeated after a worker restart, do nothing twice. Spend
is recomputed from the attempts each time, never accrued, so nothing counts twice either.
Each team, job and pause is its own unit: its error is logged with its id and the pass goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, transaction

from billing.models import BudgetPause, BudgetReservation, BudgetWarning
from billing.services import (
    WARN_AT,
    LimitStatus,
    job_limit_status,
    limit_label,
    limit_now,
    team_limit_statuses,
)
from billing.spend import job_spend
from jobs import attention, lifecycle
from jobs.models import ACTIVE_STATES, ON_HOST_STATES, Attempt, AttemptState, Checkpoint, Job
from nomadgpu.humanize import money, percent_of, share
from nomadgpu.models import ServiceHeartbeat, Team

logger = logging.getLogger(__name__)

RELEASE, ASK, WAIT = "release", "ask", "wait"
NOT_ASKED, ASKED, ARRIVED = "not asked", "asked", "arrived"
# On top of the measured time: uploads vary, and saving (before the upload) is not measured.
LEAD_MARGIN = 0.5
AGENT_SCAN_S = 1.0  # the agent looks for newly ready checkpoints every second
RECENT_UPLOADS = 3
MAX_LEAD_S = 3600.0
# What a pass reports: warnings written, pauses begun, checkpoints asked, machines released.
REPORT_KINDS = ("warned", "pausing", "asked", "released")


def interval_s() -> float:
    """Seconds between enforcement passes."""
    return float(settings.WATCHDOG_INTERVAL_S)


PASS_ROW = "budget-pass"
RECENT_PASSES = 20
# The longest gap between recent passes, as the running pass read it (``recent_gaps``).
_longest_gap_s = 0.0


def pass_gap_s() -> float:
    """Seconds from one pass to the next at the latest: the interval, or the longest gap
    between the recent passes when they came late (a worker busy with other tasks runs the
    beat's pass late, and a machine released at the pass after its deadline would spend past
    the limit by that lateness)."""
    return max(interval_s(), _longest_gap_s)


def recent_gaps(previous: ServiceHeartbeat | None, *, now: datetime) -> list[float]:
    """The gaps between the recent passes (the ``budget-pass`` row PREVIOUS keeps them), with
    this one's at NOW. A gap over ten intervals is a stopped beat or worker, not lateness: it
    is not kept."""
    if previous is None:
        return []
    gaps = [float(g) for g in (previous.detail or {}).get("gaps", [])]
    gap = (now - previous.last_seen_at).total_seconds()
    if 0 < gap <= 10 * interval_s():
        gaps.append(round(gap, 3))
    return gaps[-RECENT_PASSES:]


def grace_s() -> float:
    """The checkpoint lead of a job none of whose uploads was measured yet."""
    return float(settings.BUDGET_CHECKPOINT_GRACE_S)


def budget_pass(*, now: datetime) -> dict[str, int]:
    """One enforcement pass at NOW; says how many of each ``REPORT_KINDS`` it did. Open pauses
    first (a release frees budget for the rest), then per team every limit near or past its
    mark, then the pauses again (one just begun for a job with no host is released in the same
    pass). Each step is claimed and acted on in its own transaction (``claim_step``)."""
    global _longest_gap_s
    report = dict.fromkeys(REPORT_KINDS, 0)
    gaps = recent_gaps(ServiceHeartbeat.objects.filter(name=PASS_ROW).first(), now=now)
    _longest_gap_s = max(gaps, default=0.0)
    try:
        finish_pauses(report, now=now)
        teams = Team.objects.filter(jobs__state__in=ACTIVE_STATES).distinct().order_by("pk")
        for team in teams:
            as_unit(f"team {team.pk}", check_team, team, report, now=now)
        finish_pauses(report, now=now)
        record_pass(now=now, gaps=gaps)
    finally:
        _longest_gap_s = 0.0  # outside a pass, the interval
    return report


def as_unit(
    row: str, func: Callable[..., object], *args, job_id: int | None = None, now: datetime, **kw
) -> None:
    """FUNC for one row of the pass (a team, a job, a pause): its error is logged with ROW and
    written once on its job (JOB_ID, if the row is one job's), and the pass goes on, so one
    bad row never stops enforcement for the others. A team's error is a supervisor-health
    line (the ``budget-pass`` ``ServiceHeartbeat``, which the admin shows)."""
    try:
        func(*args, now=now, **kw)
    except (OperationalError, InterfaceError):
        raise  # the database itself: every row would fail alike
    except Exception as exc:
        logger.exception("budget pass: %s failed; the pass goes on without it", row)
        why = attention.describe(exc)
        if job_id is not None:
            attention.note_on_job(
                job_id, f"the budget pass could not check this job: {why}", now=now
            )
        else:
            _failed_rows[row] = why


_failed_rows: dict[str, str] = {}


def record_pass(*, now: datetime, gaps: Sequence[float]) -> None:
    """Keep the rows (teams) the pass just ended could not check, for the admin, and the
    recent gaps between passes (``pass_gap_s``)."""
    detail = {"failed": dict(sorted(_failed_rows.items())), "gaps": list(gaps)}
    _failed_rows.clear()
    ServiceHeartbeat.objects.update_or_create(
        name=PASS_ROW, defaults={"last_seen_at": now, "detail": detail}
    )


def claim_step(
    kind: str, report: dict[str, int], step: Callable[..., bool], *args, **kwargs
) -> None:
    """Run STEP (billing's claim and the transitions it calls) in one transaction, counted
    under KIND in REPORT when it acted on a job. A claim another pass wrote first
    (``IntegrityError``: the same warning key, the one open pause per job) does nothing."""
    try:
        with transaction.atomic():
            acted = step(*args, **kwargs)
    except IntegrityError:
        return  # another pass wrote the same claim first
    if acted:
        report[kind] += 1


def check_team(team: Team, report: dict[str, int], *, now: datetime) -> None:
    """TEAM's limits: a warning for each at ``WARN_AT``, and a pause begun for each started
    job under a limit that must stop it now (``stop_in_time``)."""
    widest = max(MAX_LEAD_S, grace_s())  # most limits are far away: no per-job look at all
    for status in statuses_to_check(team, now=now):
        if status.ratio >= WARN_AT:
            claim_step("warned", report, warn_once, status, now=now)
        if must_stop(status, lead_s=widest):
            for job_id in list(status.affected_jobs(started_only=True)):
                as_unit(f"job {job_id}", stop_job, job_id, status, report, job_id=job_id, now=now)


def stop_job(job_id: int, status: LimitStatus, report: dict[str, int], *, now: datetime) -> None:
    """Begin JOB_ID's pause for STATUS's limit if it must begin now."""
    if stop_in_time(job_id, status, now=now):
        claim_step("pausing", report, start_pause, job_id, status, now=now)


def statuses_to_check(team: Team, *, now: datetime) -> list[LimitStatus]:
    """The limits of TEAM's active jobs: the team's, their submitters', their own."""
    active = Job.objects.active().filter(team=team)
    users = set(active.values_list("created_by_id", flat=True))
    found = team_limit_statuses(team, now=now, users=users)
    for job in active.exclude(budget_usd=None):
        found.append(job_limit_status(job, now=now))
    return found


def must_stop(status: LimitStatus, *, lead_s: float) -> bool:
    """The limit is reached, or will be before a checkpoint asked at the next pass could arrive:
    within LEAD_S plus two intervals (the next pass, the deadline's) at the scope's burn."""
    ahead_h = (lead_s + 2 * pass_gap_s()) / 3600.0
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
    return now + timedelta(seconds=max(to_limit - pass_gap_s(), 0.0))


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
    interval = timedelta(seconds=pass_gap_s())
    if checkpoint == ARRIVED and now + lead > deadline:
        if asked_at is not None and asked_at + lead + interval < deadline:
            return ASK  # what we hold is old: a late request beats none
        runs_out = deadline + interval
        return RELEASE if now - started_at >= (runs_out - started_at) / 2 else ASK
    if now + lead + interval >= deadline:
        return ASK  # the next pass would ask too late
    return WAIT


def warn_once(status: LimitStatus, *, now: datetime) -> bool:
    """Claim the 80 % warning of STATUS's limit and period (once: another pass writing the same
    key first makes this one roll back); a ``budget_warning`` event on each affected job. True
    when it warned a job."""
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
        return False
    message = status.used()
    data = {
        "limit": status.kind,
        "limit_usd": float(status.limit_usd),
        # to the micro-dollar: a notification writes it by the money rule, as the message does
        "spent_usd": round(status.spent_usd, 6),
    }
    warned = list(status.affected_jobs())
    for job_id in warned:
        lifecycle.record_event(job_id, now=now, kind="budget_warning", message=message, **data)
    return bool(warned)


def stop_in_time(job_id: int, status: LimitStatus, *, now: datetime) -> bool:
    """Whether JOB_ID's pause must begin now: STATUS's limit is within the job's checkpoint
    lead and no pause is open. An open pause's deadline is brought forward when spend jumped."""
    deadline = pause_deadline(status, now=now)
    open_pause = BudgetPause.objects.filter(job_id=job_id, released_at=None)
    if deadline is not None:
        open_pause.filter(deadline__gt=deadline).update(deadline=deadline)
    return not open_pause.exists() and must_stop(status, lead_s=job_lead_s(job_id))


def start_pause(job_id: int, status: LimitStatus, *, now: datetime) -> bool:
    """Begin stopping JOB_ID for STATUS's limit: open a pause with a deadline and ask a training
    agent for a checkpoint (one still starting is asked once it trains); a job with no host
    is released at once. False when the job ended or a pause is open already."""
    job = Job.objects.select_for_update().started().filter(pk=job_id)
    if not job.exists() or BudgetPause.objects.filter(job_id=job_id, released_at=None).exists():
        return False
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
    lifecycle.record_event(job_id, now=now, kind="budget_checkpoint", message=message)
    if training:
        lifecycle.request_checkpoint(live.pk)
    return True


def checkpoint_state(pause: BudgetPause) -> str:
    """Where PAUSE's last checkpoint request stands: ``NOT_ASKED``, ``ASKED`` or ``ARRIVED``
    (a checkpoint newer than the request became ready)."""
    if pause.asked_at is None:
        return NOT_ASKED
    return ARRIVED if answer_to_request(pause) is not None else ASKED


def answer_to_request(pause: BudgetPause) -> Checkpoint | None:
    """The first checkpoint newer than PAUSE's last request that became ready after it."""
    newer = Checkpoint.objects.filter(job_id=pause.job_id, ready_at__gte=pause.asked_at).ready()
    if pause.checkpoint_step is not None:
        newer = newer.filter(step__gt=pause.checkpoint_step)
    return newer.order_by("ready_at").first()


def pause_lead_s(pause: BudgetPause, checkpoint: str) -> float:
    """The lead PAUSE's next request is timed with: the job's ``job_lead_s``, or what its own
    last request took end to end when that was longer (ARRIVED). The parts-based lead misses
    what only the whole trip shows: a heartbeat that came late, a script slow to see the
    request, a loaded host; a request timed on it then lands after the deadline, and the job
    keeps the checkpoint from the start."""
    lead_s = job_lead_s(pause.job_id)
    if checkpoint != ARRIVED:
        return lead_s
    answer = answer_to_request(pause)
    return max(lead_s, (answer.ready_at - pause.asked_at).total_seconds()) if answer else lead_s


def finish_pauses(report: dict[str, int], *, now: datetime) -> None:
    """Every open pause whose ``pause_action`` is to release its machine or ask for a checkpoint
    (once the job trains) does so."""
    for pause in BudgetPause.objects.filter(released_at=None).select_related("attempt"):
        as_unit(
            f"pause {pause.pk} of job {pause.job_id}",
            finish_pause,
            pause,
            report,
            job_id=pause.job_id,
            now=now,
        )


def finish_pause(pause: BudgetPause, report: dict[str, int], *, now: datetime) -> None:
    """Release PAUSE's machine or ask for a checkpoint, as its ``pause_action`` says."""
    action = RELEASE if pause.deadline <= now else _action(pause, now=now)
    if action == RELEASE:
        claim_step("released", report, release, pause, now=now)
    elif action == ASK:
        claim_step("asked", report, ask_for_checkpoint, pause, now=now)


def _action(pause: BudgetPause, *, now: datetime) -> str:
    attempt = pause.attempt
    started = (attempt.registered_at or attempt.rented_at) if attempt else None
    checkpoint = checkpoint_state(pause)
    return pause_action(
        now=now,
        started_at=min(started or pause.requested_at, pause.requested_at),
        deadline=pause.deadline,
        lead_s=pause_lead_s(pause, checkpoint),
        checkpoint=checkpoint,
        asked_at=pause.asked_at,
    )


def ask_for_checkpoint(pause: BudgetPause, *, now: datetime) -> bool:
    """Ask PAUSE's agent for a checkpoint now (nearer the deadline than any before), if it
    trains: an agent still starting has no script to signal yet. True when it asked."""
    if pause.attempt is None or pause.attempt.state != AttemptState.RUNNING:
        return False
    newest = Checkpoint.objects.filter(job_id=pause.job_id).newest_ready_step()
    claim = BudgetPause.objects.filter(pk=pause.pk, released_at=None, asked_at=pause.asked_at)
    if not claim.update(asked_at=now, checkpoint_step=newest):
        return False  # another enforcer asked first
    logger.info(
        "job %s: checkpoint asked, %s before the deadline", pause.job_id, pause.deadline - now
    )
    lifecycle.request_checkpoint(pause.attempt_id)
    return True


def release(pause: BudgetPause, *, now: datetime) -> bool:
    """Close PAUSE: the job goes paused_budget, naming the limit, and its machine is released
    (``lifecycle.pause_for_budget``). A job that ended meanwhile (finished, cancelled) is left
    as it is. True when it paused the job."""
    if not BudgetPause.objects.filter(pk=pause.pk, released_at=None).update(released_at=now):
        return False
    BudgetReservation.objects.filter(job_id=pause.job_id).delete()
    job = Job.objects.select_for_update().get(pk=pause.job_id)
    if job.state not in ACTIVE_STATES:
        return False  # finished, failed or cancelled meanwhile: nothing to release
    step = Checkpoint.objects.filter(job=job).newest_ready_step()
    spent = job_spend(job, now=now).total
    status = limit_now(job, pause.limit, now=now)  # the share it fired at, short of 100 %
    limit_usd, used = (status.limit_usd, status.spent_usd) if status else (pause.limit_usd, 0.0)
    label = limit_label(pause.limit, limit_usd)
    logger.info("job %s paused by the %s", pause.job_id, label)
    at = f"at {share(used, limit_usd)} of the {label} ({money(used)} spent)" if status else ""
    when = "crossed already" if status and used >= limit_usd else "before it is crossed"
    kept = f"progress kept at checkpoint {step}" if step is not None else "no checkpoint yet"
    message = f"paused {at or 'by the ' + label}, {when}: machine released, {kept} "
    message += f"(job spend {money(spent)})"
    data = {
        "limit": pause.limit,
        "limit_usd": float(limit_usd),
        # the limit's spend and share when the machine was released: what the message quotes
        "spent_usd": round(used if status else pause.spent_usd, 6),
        "percent_used": percent_of(used, limit_usd) if status else None,
        "job_spend_usd": round(spent, 6),
        "checkpoint_step": step,
    }
    lifecycle.pause_for_budget(job.pk, message=message, data=data, now=now)
    return True
