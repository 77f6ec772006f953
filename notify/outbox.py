"""The notification outbox: one ``Delivery`` per (channel, event), each delivered once.

``enqueue_for_event`` runs inside the event's transaction (``notify.signals`` calls it when a
``JobEvent`` row is saved), so deliveries exist exactly when the event does.
``deliver_due`` is the worker's loop: it claims due rows with guarded updates, calls the
transport outside any transaction and records the result afterwards. Several workers may run
it at once; a claim that changes no row means another worker has the delivery.

A claimed row is ``sending`` with ``next_attempt_at`` as its lease: a worker that died mid-send
leaves it there, and the row is taken over once the lease runs out (at worst a second send of
that one message, never a lost one). Within a channel, a job's messages go out in event order:
a delivery waits while an earlier one of the same job to the same channel is still open, so
"running again" never arrives before its "host lost", even when that one needed a retry.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import F

from jobs.models import JobEvent
from notify import messages
from notify.models import (
    NOTIFIABLE_KINDS,
    OPEN_STATES,
    Channel,
    Delivery,
    DeliveryState,
)
from notify.transports import TransportError, transport_for

logger = logging.getLogger(__name__)

BATCH = 50
LEASE = timedelta(minutes=2)  # well above one send (10 s timeout, at most two requests)
MAX_ATTEMPTS = 8
BACKOFF_START_S = 15
BACKOFF_CAP_S = 30 * 60
SWITCHED_OFF = "channel disabled"


def enqueue_for_event(event: JobEvent) -> int:
    """Write a pending delivery of EVENT for each enabled channel of its team that subscribed
    to its kind; return how many. Call inside the event's transaction. Safe to call twice."""
    if event.kind not in NOTIFIABLE_KINDS:
        return 0
    channels = Channel.objects.filter(team__jobs=event.job_id, enabled=True)
    wanted = [c.pk for c in channels if c.wants(event.kind)]
    if not wanted:
        return 0
    existing = set(Delivery.objects.filter(event=event).values_list("channel_id", flat=True))
    new = [
        Delivery(channel_id=pk, event=event, next_attempt_at=event.created_at)
        for pk in wanted
        if pk not in existing
    ]
    Delivery.objects.bulk_create(new, ignore_conflicts=True)
    return len(new)


@dataclass
class Report:
    """What one turn of the loop did (also the task's return value, for the worker log)."""

    sent: list[int] = field(default_factory=list)
    retrying: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # behind an earlier open delivery

    def as_dict(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.__dict__.items()}


def due(now: datetime):
    """Open deliveries whose time has come, oldest event first (the partial index's query)."""
    return Delivery.objects.filter(state__in=OPEN_STATES, next_attempt_at__lte=now).order_by(
        "event_id", "id"
    )


def deliver_due(now: datetime, *, limit: int = BATCH) -> Report:
    """Send what is due. One bad row pushes its own deadline back; it never stops the loop."""
    report = Report()
    started = time.monotonic()
    for delivery in list(due(now).select_related("event")[:limit]):
        # The clock moves while we send; leases and backoffs count from the real moment.
        moment = now + timedelta(seconds=time.monotonic() - started)
        try:
            deliver_one(delivery, now=moment, report=report)
        except Exception:  # e.g. the database refused the claim: the next turn tries again
            logger.exception("could not deliver %s", delivery.pk)
    return report


def deliver_one(delivery: Delivery, *, now: datetime, report: Report) -> None:
    if waits_for_earlier(delivery):
        report.waiting.append(delivery.pk)
        return
    attempts = claim(delivery, now=now)
    if attempts is None:
        return  # another worker has it
    try:
        channel = Channel.objects.select_related("team").get(pk=delivery.channel_id)
        if not channel.enabled:
            finish(delivery.pk, attempts, now=now, state=DeliveryState.FAILED, error=SWITCHED_OFF)
            report.failed.append(delivery.pk)
            return
        transport_for(channel).send(messages.build(delivery.event))
    except TransportError as exc:
        record_failure(delivery, attempts, exc, now=now, report=report)
        return
    except Exception as exc:  # a bug, an unreadable secret, a missing row: retried, then given up
        logger.exception("delivery %s failed unexpectedly", delivery.pk)
        error = TransportError(f"internal error: {exc!r}"[:500])
        record_failure(delivery, attempts, error, now=now, report=report)
        return
    finish(delivery.pk, attempts, now=now, state=DeliveryState.SENT)
    report.sent.append(delivery.pk)


def waits_for_earlier(delivery: Delivery) -> bool:
    """True while an earlier event of the same job is still open for the same channel.

    Per job, not per channel: one job's stuck message never holds back another job's."""
    return Delivery.objects.filter(
        channel_id=delivery.channel_id,
        event__job_id=delivery.event.job_id,
        state__in=OPEN_STATES,
        event_id__lt=delivery.event_id,
    ).exists()


def claim(delivery: Delivery, *, now: datetime) -> int | None:
    """Take DELIVERY for one send (guarded on the state and count we saw); the new count."""
    claimed = Delivery.objects.filter(
        pk=delivery.pk, state=delivery.state, attempts=delivery.attempts
    ).update(
        state=DeliveryState.SENDING,
        attempts=F("attempts") + 1,
        next_attempt_at=now + LEASE,
        last_attempt_at=now,
    )
    return delivery.attempts + 1 if claimed == 1 else None


def finish(pk: int, attempts: int, *, now: datetime, state: str, error: str = "") -> bool:
    """Record the outcome, unless our lease ran out and another worker took the row over."""
    fields = {"state": state, "next_attempt_at": None, "last_error": error}
    if state == DeliveryState.SENT:
        fields["sent_at"] = now
    return bool(
        Delivery.objects.filter(pk=pk, state=DeliveryState.SENDING, attempts=attempts).update(
            **fields
        )
    )


def record_failure(
    delivery: Delivery, attempts: int, exc: TransportError, *, now: datetime, report: Report
) -> None:
    pk = delivery.pk
    if exc.permanent:
        finish(pk, attempts, now=now, state=DeliveryState.FAILED, error=exc.message)
        disable_channel(delivery.channel_id, reason=exc.message, now=now)
        report.failed.append(pk)
    elif attempts >= MAX_ATTEMPTS:
        error = f"gave up after {attempts} attempts: {exc.message}"
        finish(pk, attempts, now=now, state=DeliveryState.FAILED, error=error)
        report.failed.append(pk)
    else:
        postpone(pk, attempts=attempts, now=now, error=exc.message, retry_after=exc.retry_after)
        report.retrying.append(pk)


def backoff(attempts: int) -> timedelta:
    """15 s, 30 s, 1 min, … capped at 30 min."""
    return timedelta(seconds=min(BACKOFF_START_S * 2 ** max(attempts - 1, 0), BACKOFF_CAP_S))


def postpone(
    pk: int, *, attempts: int, now: datetime, error: str, retry_after: float | None = None
) -> None:
    """Back to pending, due after the server's retry_after if it gave one, else our backoff."""
    delay = timedelta(seconds=retry_after) if retry_after else backoff(attempts)
    Delivery.objects.filter(pk=pk, state=DeliveryState.SENDING, attempts=attempts).update(
        state=DeliveryState.PENDING, next_attempt_at=now + delay, last_error=error
    )


def disable_channel(channel_id: int, *, reason: str, now: datetime) -> None:
    """Switch the channel off until a team admin fixes and re-enables it; its pending
    deliveries fail (they would be stale by then)."""
    Channel.objects.filter(pk=channel_id, enabled=True).update(
        enabled=False, disabled_reason=reason[:300], disabled_at=now
    )
    Delivery.objects.filter(channel_id=channel_id, state=DeliveryState.PENDING).update(
        state=DeliveryState.FAILED, next_attempt_at=None, last_error=f"channel disabled: {reason}"
    )
    logger.warning("notification channel %s disabled: %s", channel_id, reason)


def send_trial(channel: Channel) -> str | None:
    """The admin's test message, sent now: None on success, else the error text."""
    try:
        transport_for(channel).send(messages.trial_message(channel))
    except TransportError as exc:
        return exc.message
    return None
