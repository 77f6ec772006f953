"""Spending limits as jobs sees them: the questions it must ask, and the verdicts.

``jobs`` never imports ``billing``: billing sits above it, reads the jobs' rows and decides.
Billing installs its gate when Django starts (``billing.apps``); until then, and in a
deployment without the billing app, every verdict allows. ``jobs.lifecycle`` asks only at the
moments it commits money itself: submit (admit), each rent (reserve) and resume; a hedged rent
(``jobs.renting.race``) asks before each racer it creates (reserve_racer), says when one
leaves its race (release_racer), and asks what a racer cost for the job's timeline
(racer_cost: the money truth is billing's, ``billing.spend.racer_spend``). The budget
pass that stops jobs in time is billing's own (``billing.enforce.budget_pass``, beat task
``billing.tasks.enforce_budgets``): billing calls ``jobs.lifecycle`` directly for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from jobs.models import Job


class BudgetExceeded(Exception):
    """A limit refuses the job; the message carries the numbers (shown by portal and API)."""


@dataclass(frozen=True)
class Verdict:
    """May the money be committed? REASON says why not, with the numbers. At a rent, PAUSE
    asks for the job to be paused instead of waiting (a job that lost its host and no longer
    fits), and RETRY_AFTER_S is when a waiting job asks again."""

    allowed: bool = True
    reason: str = ""
    pause: bool = False
    retry_after_s: float = 60.0


ALLOW = Verdict()


class SpendingGate(Protocol):
    def admit(self, job: Job, *, now: datetime) -> Verdict:
        """At submit, inside the transaction that created JOB."""

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        """Inside the transaction that plans JOB's rent; an allowed verdict holds the cost."""

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        """Before a budget-paused JOB goes back to the queue."""

    def reserve_racer(self, job: Job, *, amount_usd: float, now: datetime) -> Verdict:
        """Before a racer of JOB is created: hold AMOUNT_USD (what it costs should it lose)
        against the limits; refused, the racer is not created."""

    def release_racer(
        self, job: Job, *, reserved_usd: float, spent_usd: float, now: datetime
    ) -> None:
        """A racer of JOB left its race: the RESERVED_USD it held goes, and the SPENT_USD it
        cost is the job's own spend from now (the loser's money is the job's)."""

    def racer_cost(self, racer: Any, *, now: datetime) -> float | None:
        """What RACER has cost up to NOW (or its end); None when nothing can say."""


class NoLimits:
    """The gate until billing installs its own: nothing is limited."""

    def admit(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def reserve_racer(self, job: Job, *, amount_usd: float, now: datetime) -> Verdict:
        return ALLOW

    def release_racer(
        self, job: Job, *, reserved_usd: float, spent_usd: float, now: datetime
    ) -> None:
        return None

    def racer_cost(self, racer: Any, *, now: datetime) -> float | None:
        return None


_gate: SpendingGate = NoLimits()


def install(gate: SpendingGate) -> None:
    """Make GATE the one that answers (billing's ``AppConfig.ready``)."""
    global _gate
    _gate = gate


def gate() -> SpendingGate:
    """The installed gate."""
    return _gate
