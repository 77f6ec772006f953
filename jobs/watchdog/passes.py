"""One watchdog pass: what a tick does, in order, every few seconds (Celery beat).

A host is lost when (the causes, each answered in its own module of ``jobs.watchdog``):
1. the provider says so: instance missing, exited, offline, unknown for two polls, outbid, or
   its contract given up before the container ran (``instance_status``; one paged list call
   per provider account, at most every ``PROVIDER_POLL_INTERVAL_S``: ``poll``);
2. no heartbeat for the heartbeat timeout;  3. the agent reported a GPU fault;
4. no training progress for ``stall_timeout``;  5. never registered within ``start_timeout``
   (2-5: ``deadlines``, through one indexed query on ``heartbeat_deadline``).

A pass records itself, closes an outage that is over (``outages``), handles the losses it
finds, polls the provider when due (losses, adoptions, orphans, offline hosts, outbids,
contracts about to end), settles rent claims whose worker died (``adopt``), and then, in this
same pass, plans a rent for every job that needs a host: a job whose host was lost above gets
its replacement planned before the pass ends. Each row is its own unit: its error stays with
its job (``jobs.attention.row``) and the pass goes on. Every pass is an idempotent reconciler:
a duplicate tick only wastes work.

It also asks the running attempts of ``checkpoint = "auto"`` jobs for the checkpoints their
Young/Daly interval calls for, and nudges rents and stagings whose message was lost.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F

from jobs import attention, lifecycle
from jobs.checkpoints import requests
from jobs.lifecycle import Loss
from jobs.models import LIVE_ATTEMPT_STATES, Attempt, AttemptState, Job
from jobs.staging import stage
from jobs.watchdog.adopt import settle_unsent_claims
from jobs.watchdog.contracts import move_off_expiring_contracts
from jobs.watchdog.deadlines import find_due_losses
from jobs.watchdog.outages import end_outage_if_over, gather_evidence
from jobs.watchdog.poll import poll_providers
from nomadgpu.models import ServiceHeartbeat

logger = logging.getLogger(__name__)


WATCHDOG = "watchdog"


def record_tick(*, now: datetime) -> None:
    """Mark the watchdog alive at NOW (the status page's 'is the watchdog ticking')."""
    updated = ServiceHeartbeat.objects.filter(name=WATCHDOG).update(
        last_seen_at=now, count=F("count") + 1
    )
    if not updated:
        ServiceHeartbeat.objects.get_or_create(
            name=WATCHDOG, defaults={"last_seen_at": now, "count": 1}
        )


def tick(*, now: datetime, poll_provider: bool | None = None) -> dict:
    """Run one watchdog pass at NOW and say what it did. Each row (a loss, an account, a job)
    is its own unit: one that raises is logged, written once where a person sees it
    (``jobs.attention``), and the pass goes on."""
    record_tick(now=now)
    attention.begin_pass()
    if poll_provider is None:
        poll_provider = provider_poll_due(now)
    evidence = gather_evidence()
    if end_outage_if_over(evidence, now=now):
        evidence = gather_evidence()  # silence now counts from the outage's end
    lost = [handle_loss(loss, now=now) for loss in find_due_losses(now, evidence)]
    moved = 0
    if poll_provider:
        lost += [handle_loss(loss, now=now) for loss in poll_providers(now)]
        # Contract ends only change with a poll: checked at its cadence, not every tick.
        moved = move_off_expiring_contracts(now)
    settled = settle_unsent_claims(now)
    planned = [plan_rent(job_id, now=now) for job_id in jobs_needing_a_host(now)]
    report = {
        "settled": settled,
        # Jobs with `checkpoint = "auto"`: one query when there are none.
        "checkpoints_asked": requests.ask_due_checkpoints(now),
        "moved": moved,
        "lost": sum(bool(x) for x in lost),
        "planned": sum(p is not None for p in planned),
        "nudged": nudge_planned(now),
        "staging_nudged": stage.nudge_staging(now),
        "held": evidence.outage_open,
    }
    report["failed"] = attention.record_pass(now=now)
    return report


# A row whose loss could not be handled is looked at again this much later, not every tick.
FAILED_ROW_RETRY = timedelta(seconds=60)


def handle_loss(loss: Loss, *, now: datetime) -> bool:
    """``lifecycle.handle_loss`` for one row: its error stays with its job, and pushes its own
    deadline back."""
    job_id = Attempt.objects.filter(pk=loss.attempt_id).values_list("job_id", flat=True).first()
    handled = False
    with attention.row(job_id=job_id, what="handle its host's loss", now=now) as row:
        handled = lifecycle.handle_loss(loss, now=now)
    if row.failed:
        Attempt.objects.filter(pk=loss.attempt_id, heartbeat_deadline__lte=now).update(
            heartbeat_deadline=now + FAILED_ROW_RETRY
        )
    return bool(handled)


def plan_rent(job_id: int, *, now: datetime) -> Attempt | None:
    """``lifecycle.plan_rent`` for one job, unless its stored spec no longer validates (then
    it is held for attention); its error stays with it."""
    with attention.row(job_id=job_id, what="plan its next rent", now=now):
        return plan_valid_rent(job_id, now=now)
    return None  # the row failed: its error stays with the job


def plan_valid_rent(job_id: int, *, now: datetime) -> Attempt | None:
    job = Job.objects.get(pk=job_id)
    if attention.hold_if_spec_invalid(job, now=now):
        return None
    return lifecycle.plan_rent(job_id, now=now)


def nudge_planned(now: datetime) -> int:
    """Send the rent message again for attempts planned long ago and still unclaimed; say how
    many. The first message was lost (a broker restart, a dropped message): without this the
    planned attempt would hold the job's one live slot forever. ``jobs.renting.rent.rent`` claims an
    attempt once, so a duplicate message is a no-op."""
    # No ordering: the model's default (by job) joined every attempt to its job for nothing.
    stale = (
        Attempt.objects.filter(
            state=AttemptState.PLANNED,
            created_at__lte=now - timedelta(seconds=settings.RENT_NUDGE_AFTER_S),
        )
        .order_by()
        .values_list("pk", flat=True)
    )
    ids = list(stale)
    for attempt_id in ids:
        logger.warning("attempt %s was never claimed; sending its rent message again", attempt_id)
        try:
            lifecycle.send_task(lifecycle.RENT_TASK, attempt_id)
        except Exception:  # the broker: every nudge would fail alike; the next tick retries
            logger.exception("could not send the rent message of attempt %s again", attempt_id)
            break
    return len(ids)


def provider_poll_due(now: datetime) -> bool:
    """True when the last provider poll is older than the poll interval (claims the slot)."""
    interval = timedelta(seconds=settings.PROVIDER_POLL_INTERVAL_S)
    name = "provider-poll"
    claimed = ServiceHeartbeat.objects.filter(name=name, last_seen_at__lte=now - interval).update(
        last_seen_at=now, count=F("count") + 1
    )
    if claimed:
        return True
    _, created = ServiceHeartbeat.objects.get_or_create(name=name, defaults={"last_seen_at": now})
    return created


def jobs_needing_a_host(now: datetime) -> list[int]:
    """Jobs waiting for a host with no live attempt whose backoff has passed."""
    return list(
        Job.objects.needs_host()
        .exclude(stage_state=lifecycle.STAGING)
        .exclude(attempts__state__in=LIVE_ATTEMPT_STATES)
        .exclude(next_rent_at__gt=now)
        .order_by("pk")  # oldest first; the default (-created_at) sorted every time
        .values_list("pk", flat=True)
    )
