"""Celery tasks of billing: thin, safe to run twice. (The budget pass is ``jobs.tasks``'s:
jobs acts on billing's verdicts.)"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from billing import invoices, reconcile
from nomadgpu.models import Team

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def sync_invoices() -> int:
    """Beat's tick: one ``sync_team_invoices`` per team (a team's failure stops only its own)."""
    ids = list(Team.objects.values_list("pk", flat=True))
    for team_id in ids:
        sync_team_invoices.delay(team_id)
    return len(ids)


@shared_task(
    ignore_result=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.VAST_TASK_SOFT_LIMIT_S,
    time_limit=settings.VAST_TASK_SOFT_LIMIT_S + 30,
)
def sync_team_invoices(team_id: int) -> dict:
    """Import TEAM_ID's charges and payments, match them, flag discrepancies (idempotent; a
    failure keeps the finished days and the next tick resumes)."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return {}
    now = timezone.now()
    result = invoices.sync_team(team, now=now)
    flags = reconcile.flag_discrepancies(team, now=now)
    logger.info("invoices of %s: %s, %d new flags", team.slug, result, flags)
    return {**result.__dict__, "flags": flags}
