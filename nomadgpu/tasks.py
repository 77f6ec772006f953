from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from nomadgpu.models import ServiceHeartbeat


@shared_task(ignore_result=True)
def record_ping(name: str) -> None:
    """Record that a worker ran this task: how tests and health checks prove the broker path."""
    ServiceHeartbeat.objects.update_or_create(
        name=name, defaults={"last_seen_at": timezone.now(), "detail": {"via": "celery"}}
    )
