"""Spending limits as jobs sees them: the questions it must ask, and the verdicts.

``jobs`` never imports ``billing``: billing sits above it, reads the jobs' rows and decides.
Billing installs its gate when Django starts (``billing.apps``); until then, and in a
deployment without the billing app, every verdict allows. ``jobs.lifecycle`` asks only at the
moments it commits money itself: submit (admit), each rent (reserve) and resume. The budget
pass that stops jobs in time is billing's own (``billing.enforce.budget_pass``, beat task
``billing.tasks.enforce_budgets``): billing calls ``jobs.lifecycle`` directly for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

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


class NoLimits:
    """The gate until billing installs its own: nothing is limited."""

    def admit(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW


_gate: SpendingGate = NoLimits()


def install(gate: SpendingGate) -> None:
    """Make GATE the one that answers (billing's ``AppConfig.ready``)."""
    global _gate
    _gate = gate


def gate() -> SpendingGate:
    """The installed gate."""
    return _gate
