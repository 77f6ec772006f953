"""Celery tasks of billing: thin, safe to run twice."""

from __future__ import annotations

import logging
from functools import partial

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing import enforce, invoices, reconcile
from nomadgpu.models import Team

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def enforce_budgets() -> dict:
    """One budget pass (``enforce.budget_pass``): beat's ``budget-enforce``, at the watchdog's
    cadence, and once when a worker starts (``billing.apps``)."""
    return enforce.budget_pass(now=timezone.now())


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


def queue_team_import(team_id: int) -> None:
    """Send TEAM_ID's ``sync_team_invoices`` (the task the beat fans out) once the current
    transaction commits: finance's "Import now" runs the same idempotent import as the beat."""
    transaction.on_commit(partial(sync_team_invoices.delay, team_id))
