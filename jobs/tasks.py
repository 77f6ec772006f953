from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from jobs import watchdog


@shared_task(ignore_result=True)
def watchdog_tick() -> dict:
    return watchdog.tick(now=timezone.now())
