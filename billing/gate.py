"""Billing's answers to jobs' spending questions (``jobs.spending.SpendingGate``), installed
by ``billing.apps`` when Django starts."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from billing import enforce, services
from jobs.models import Job
from jobs.spending import BudgetStep, Verdict


class BudgetGate:
    """The team, member and job limits (``billing.services``, ``billing.enforce``)."""

    def admit(self, job: Job, *, now: datetime) -> Verdict:
        return services.preflight(job, now=now)

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        return services.reserve_for_rent(job, now=now)

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        return services.resume_verdict(job, now=now)

    def budget_pass(self, *, now: datetime) -> Iterable[BudgetStep]:
        return enforce.budget_pass(now=now)
