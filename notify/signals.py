"""Outbox rows for each new job event, in the event's own transaction."""

from __future__ import annotations

from functools import partial

from celery import current_app
from django.db import transaction

from jobs.models import JobEvent
from notify import outbox

DELIVER_TASK = "notify.tasks.deliver_due"


def queue_notifications(sender, instance: JobEvent, created: bool, **_kwargs) -> None:
    """Write the outbox rows EVENT calls for; a worker sends them after commit."""
    if created and outbox.enqueue_for_event(instance):
        # robust: a broker that is down must not undo the commit; beat sweeps the outbox.
        transaction.on_commit(partial(current_app.send_task, DELIVER_TASK), robust=True)
