"""The supervisor's checkpoint requests for jobs with ``checkpoint = "auto"`` (Young/Daly).

The watchdog's tick calls ``ask_due_checkpoints``: for each running attempt of such a job it
works out the interval (``interval.choose_interval`` on the host's failure rate and
the job's measured uploads) and, once that long has passed since the attempt's newest ready
checkpoint (or its start), has the next heartbeat answer ``checkpoint_now``
(``lifecycle.request_checkpoint``) and writes one ``checkpoint_asked`` event with the interval
and why. A request left unanswered (no checkpoint announced within
``interval.ignored_after_s``) writes one ``checkpoint_ignored`` event and the job is
not asked again: the script keeps its own interval. That is per job, not per attempt, since
whether a script handles the request is the script's doing, not the host's.

Nothing is stored besides those events (and the attempt's ``pending_command``, which budget
enforcement and contract moves use too: a request already pending is left alone).
"""

from __future__ import annotations

import logging
from datetime import datetime

from hosts import selection
from hosts.models import Machine
from hosts.selection import BYTES_PER_GB
from jobs import attention, lifecycle
from jobs.checkpoints import interval as ci
from jobs.models import Attempt, AttemptState, Checkpoint, CheckpointState, Job, JobEvent
from jobs.rent_decision import RentDecision
from jobs.renting import interruption_rates

logger = logging.getLogger(__name__)

ASKED, IGNORED = "checkpoint_asked", "checkpoint_ignored"
IGNORED_MESSAGE = "the script did not checkpoint when asked"
RECENT_UPLOADS = 5


def is_auto(job: Job) -> bool:
    """Whether JOB asked the supervisor to choose its checkpoint interval."""
    return (job.profile or {}).get("checkpoint") == ci.AUTO


def auto_attempts():
    """Running attempts of jobs that chose ``auto`` and were not found ignoring a request."""
    return (
        Attempt.objects.filter(state=AttemptState.RUNNING, job__profile__checkpoint=ci.AUTO)
        .exclude(job__events__kind=IGNORED)
        .select_related("job")
        .order_by("pk")
    )


def ask_due_checkpoints(now: datetime) -> int:
    """One pass at NOW over the auto jobs' running attempts; returns how many were asked."""
    rates: dict[int, selection.PreemptionRates] = {}
    asked = 0
    for attempt in auto_attempts():
        team_id = attempt.job.team_id
        if team_id not in rates:
            rates[team_id] = interruption_rates.preemption_rates(team_id, now=now)
        # One bad row must not stop the tick (losses, nudges): its error stays with its job.
        what = "decide when to ask it for a checkpoint"
        with attention.row(job_id=attempt.job_id, what=what, now=now):
            asked += bool(decide(attempt, rates=rates[team_id], now=now))
    return asked


def decide(attempt: Attempt, *, rates: selection.PreemptionRates, now: datetime) -> bool:
    """Ask ATTEMPT for a checkpoint, note it ignored one, or wait; True when it was asked."""
    ready_at, asked_at = last_ready_at(attempt), last_asked_at(attempt)
    pending = asked_at is not None and asked_at > ready_at
    waited_s = (now - ready_at).total_seconds()
    if not pending and waited_s < ci.shortest_interval_s(attempt.job.heartbeat_interval_s):
        return False  # not due at any interval: most ticks stop here, before the history
    choice = interval_for(attempt, rates=rates, now=now)
    uploading = announced = False
    if asked_at is not None:
        since = Checkpoint.objects.filter(attempt=attempt, created_at__gte=asked_at)
        uploading = since.exclude(state=CheckpointState.FAILED).exists()
        announced = uploading or since.exists()
    action = ci.next_action(
        now=now,
        interval_s=choice.interval_s,
        last_ready_at=ready_at,
        asked_at=asked_at,
        uploading_since_ask=uploading,
        announced_since_ask=announced,
        ignored_after=ci.ignored_after_s(
            choice.delta_s, attempt.job.heartbeat_interval_s, attempt.seconds_per_step or 0.0
        ),
    )
    if action == ci.IGNORED:
        note_ignored(attempt, asked_at=asked_at, now=now)
    return action == ci.ASK and ask(attempt, choice, now=now)


def ask(attempt: Attempt, choice: ci.IntervalChoice, *, now: datetime) -> bool:
    """Set ``checkpoint_now`` for ATTEMPT's next heartbeat and record why, once per request:
    False (nothing recorded) when another command is already pending."""
    if not lifecycle.request_checkpoint(attempt.pk):
        return False
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind=ASKED,
        message=f"checkpoint asked: every {minutes(choice.interval_s)} ({choice.why})",
        attempt_id=attempt.pk,
        **choice.as_dict(),
    )
    return True


def note_ignored(attempt: Attempt, *, asked_at: datetime, now: datetime) -> None:
    """Say once on the job's timeline that its script ignored the request made at ASKED_AT."""
    if JobEvent.objects.filter(job_id=attempt.job_id, kind=IGNORED).exists():
        return
    waited = (now - asked_at).total_seconds()
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind=IGNORED,
        message=f"{IGNORED_MESSAGE} ({waited:.0f} s without a checkpoint): "
        "the job keeps its own interval",
        attempt_id=attempt.pk,
        asked_at=asked_at.isoformat(),
    )


def interval_for(
    attempt: Attempt, *, rates: selection.PreemptionRates, now: datetime
) -> ci.IntervalChoice:
    """The checkpoint interval for ATTEMPT: its host's failure rate, what an upload costs on
    that host, and the training it has left (``interval.choose_interval``)."""
    rate, source = failure_rate(attempt, rates=rates, now=now)
    delta, delta_source = upload_cost_s(attempt)
    return ci.choose_interval(
        rate_per_h=rate,
        rate_source=source,
        delta_s=delta,
        delta_source=delta_source,
        heartbeat_s=attempt.job.heartbeat_interval_s,
        remaining_s=remaining_training_s(attempt),
    )


def upload_cost_s(attempt: Attempt) -> tuple[float, str]:
    """δ for ATTEMPT (``interval.checkpoint_cost_s``): its own uploads, else the
    size of the job's newest checkpoint (the spec's ``checkpoint_gb`` before any) over the
    host's advertised upload speed, else the job's uploads on earlier hosts."""
    job_checkpoints = Checkpoint.objects.filter(job_id=attempt.job_id)
    here = job_checkpoints.filter(attempt=attempt).upload_seconds(RECENT_UPLOADS)
    if here:
        return ci.checkpoint_cost_s(this_host_s=here)
    size = job_checkpoints.order_by("-created_at", "-pk").values_list("size", flat=True).first()
    if not size:
        size = float((attempt.job.profile or {}).get("checkpoint_gb") or 0) * BYTES_PER_GB
    return ci.checkpoint_cost_s(
        size_bytes=size,
        upload_mbps=advertised_upload_mbps(attempt),
        elsewhere_s=job_checkpoints.exclude(attempt=attempt).upload_seconds(RECENT_UPLOADS),
    )


def advertised_upload_mbps(attempt: Attempt) -> float | None:
    """The upload speed ATTEMPT's offer advertised when it was rented (its decision's record of
    the chosen offer; None for an attempt rented before that was recorded)."""
    return RentDecision.of(attempt).upload_mbps


def remaining_training_s(attempt: Attempt) -> float | None:
    """Seconds of training from ATTEMPT's newest ready checkpoint (its resume step when none)
    to the job's last step, at its reported speed; None until a heartbeat told its step,
    total and speed."""
    total = attempt.total_steps or attempt.job.total_steps
    if attempt.step is None or not total or not attempt.seconds_per_step:
        return None
    newest = Checkpoint.objects.filter(attempt=attempt).newest_ready_step()
    start = newest if newest is not None else attempt.resumed_from_step or 0
    return max(total - start, 0) * attempt.seconds_per_step


def failure_rate(
    attempt: Attempt, *, rates: selection.PreemptionRates, now: datetime
) -> tuple[float, str]:
    """λ per hour for ATTEMPT's host (``interval.failure_rate_per_h``)."""
    kind = attempt.rental or selection.ON_DEMAND
    rental_rate, source = rates.rate(kind, attempt.gpu_name, attempt.bid_margin or 0.0)
    host_rate, _ = rates.rate(selection.ON_DEMAND, attempt.gpu_name)
    losses, hours = machine_record(attempt.machine_id, now=now)
    return ci.failure_rate_per_h(
        rental_rate_per_h=rental_rate,
        rental_source=source,
        host_loss_per_h=host_rate,
        machine_interruptions=losses,
        machine_hours=hours,
    )


def machine_record(machine_id: int | None, *, now: datetime) -> tuple[int, float]:
    """(host losses, rented hours) of MACHINE_ID for every job that ran on it: the machine's
    counter, and the hours of its attempts (a few rows: one machine's rentals)."""
    if machine_id is None:
        return 0, 0.0
    losses = Machine.objects.filter(machine_id=machine_id).values_list("interruptions", flat=True)
    spans = Attempt.objects.filter(machine_id=machine_id, rented_at__isnull=False).values_list(
        "rented_at", "ended_at"
    )
    hours = sum(max(((end or now) - start).total_seconds(), 0.0) for start, end in spans) / 3600
    return (losses.first() or 0), hours


def last_ready_at(attempt: Attempt) -> datetime:
    """When ATTEMPT's newest checkpoint became ready, or when it began training."""
    newest = (
        Checkpoint.objects.filter(attempt=attempt, ready_at__isnull=False)
        .order_by("-ready_at")
        .values_list("ready_at", flat=True)
        .first()
    )
    start = attempt.running_at or attempt.rented_at or attempt.created_at
    return max(newest, start) if newest else start


def last_asked_at(attempt: Attempt) -> datetime | None:
    """When the supervisor last asked ATTEMPT for a checkpoint (its newest ``checkpoint_asked``
    event), or None."""
    return (
        JobEvent.objects.filter(job_id=attempt.job_id, kind=ASKED, data__attempt_id=attempt.pk)
        .order_by("-created_at", "-id")
        .values_list("created_at", flat=True)
        .first()
    )


def minutes(seconds: float) -> str:
    """An interval as the page says it: "12 min", "1.5 h"."""
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def page_summary(job: Job, *, now: datetime) -> dict | None:
    """What the job page says of an auto job's checkpoints: the interval in use for its running
    attempt (else the last one asked), why, and the ignored warning; None for a script job."""
    if not is_auto(job):
        return None
    ignored = JobEvent.objects.filter(job=job, kind=IGNORED).order_by("created_at").first()
    running = job.attempts.filter(state=AttemptState.RUNNING).first()
    choice: dict | None = None
    if running is not None:
        rates = interruption_rates.preemption_rates(job.team_id, now=now)
        choice = interval_for(running, rates=rates, now=now).as_dict()
    else:
        last = JobEvent.objects.filter(job=job, kind=ASKED).order_by("-created_at").first()
        choice = last.data if last else None
    interval = None
    if choice and choice.get("interval_s") is None:
        interval = "none before the end"  # split_remaining: the job ends sooner than one pays
    elif choice:
        interval = f"every {minutes(choice['interval_s'])}"
    return {
        "interval": interval,
        "why": choice["why"] if choice else "",
        "ignored": ignored.message if ignored else "",
    }
