"""Billing's answers to jobs' spending questions (``jobs.spending.SpendingGate``), installed
by ``billing.apps`` when Django starts. Only what jobs must ask: the budget pass is billing's
own (``billing.enforce``)."""

from __future__ import annotations

from datetime import datetime

from billing import services
from billing.spend import racer_spend
from jobs.models import Job
from jobs.spending import Verdict


class BudgetGate:
    """The team, member and job limits (``billing.services``)."""

    def admit(self, job: Job, *, now: datetime) -> Verdict:
        return services.preflight(job, now=now)

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        return services.reserve_for_rent(job, now=now)

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        return services.resume_verdict(job, now=now)

    def reserve_racer(self, job: Job, *, amount_usd: float, now: datetime) -> Verdict:
        return services.reserve_for_racer(job, amount_usd=amount_usd, now=now)

    def release_racer(
        self, job: Job, *, reserved_usd: float, spent_usd: float, now: datetime
    ) -> None:
        services.release_racer(job, reserved_usd=reserved_usd, spent_usd=spent_usd, now=now)

    def racer_cost(self, racer, *, now: datetime) -> float | None:
        return racer_spend(racer, now=now).total
