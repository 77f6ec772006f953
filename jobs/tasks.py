"""Celery tasks: thin. Each fetches by id and calls a service; all are safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from jobs import renting, watchdog

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def watchdog_tick() -> dict:
    return watchdog.tick(now=timezone.now())


@shared_task(ignore_result=True)
def rent_attempt(attempt_id: int) -> str:
    return renting.rent(attempt_id, now=timezone.now())


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=5, max_retries=8)
def destroy_instance(team_id: int, instance_id: int) -> bool:
    """Stop billing for INSTANCE_ID. Retried on failure; the orphan reaper is the backstop."""
    from hosts.vast import VastClient
    from nomadgpu.models import Team

    team = Team.objects.filter(pk=team_id).first()
    with VastClient.from_settings(team) as client:
        gone_already = not client.destroy_instance(instance_id)
    logger.info("destroyed instance %s%s", instance_id, " (already gone)" if gone_already else "")
    return True
