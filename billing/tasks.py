"""Celery tasks of billing: thin, safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from billing import enforce


@shared_task(ignore_result=True)
def enforce_budgets() -> dict:
    return enforce.enforce_budgets(now=timezone.now())
