"""Celery tasks of billing: thin, safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from billing import enforce


@shared_task(ignore_result=True)
def enforce_budgets() -> dict:
    return enforce.enforce_budgets(now=timezone.now())


logger = logging.getLogger(__name__)


# --- Invoices -------------------------------------------------------------------------------


@shared_task(ignore_result=True)
def sync_invoices() -> int:
    """Beat's tick: one ``sync_team_invoices`` per team (a team's failure stops only its own)."""
    from nomadgpu.models import Team

    ids = list(Team.objects.values_list("pk", flat=True))
    for team_id in ids:
        sync_team_invoices.delay(team_id)
    return len(ids)


@shared_task(ignore_result=True)
def sync_team_invoices(team_id: int) -> dict:
    """Import TEAM_ID's charges and payments, match them, flag discrepancies (idempotent; a
    failure keeps the finished days and the next tick resumes)."""
    from billing import invoices, reconcile
    from nomadgpu.models import Team

    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return {}
    now = timezone.now()
    result = invoices.sync_team(team, now=now)
    flags = reconcile.flag_discrepancies(team, now=now)
    logger.info("invoices of %s: %s, %d new flags", team.slug, result, flags)
    return {**result.__dict__, "flags": flags}
