"""Celery tasks: thin and safe to run twice (rows are claimed with guarded updates)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from notify import outbox


@shared_task(ignore_result=True)
def deliver_due() -> dict[str, int]:
    """Send due notifications. Beat runs it every NOTIFY_INTERVAL_S (for retries); each event
    also nudges it once its transaction commits."""
    return outbox.deliver_due(now=timezone.now()).as_dict()
