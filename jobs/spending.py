"""Spending limits as jobs sees them: verdicts it asks for, and acts on.

``jobs`` never imports ``billing``: billing sits above it, reads the jobs' rows and decides.
Billing installs its gate when Django starts (``billing.apps``); until then, and in a
deployment without the billing app, every verdict allows. ``jobs.lifecycle`` asks at the
moments money is committed (submit, each rent, resume) and once a budget pass for the steps
that stop a job in time; it alone changes the job's state on a verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class BudgetAction:
    """One thing a budget pass wants done to a job: an event, a checkpoint asked of a
    training attempt, or the job paused with its machine released (``pause``)."""

    job_id: int
    event: str = ""  # the event kind to record ("budget_warning", "budget_checkpoint")
    message: str = ""
    data: dict = field(default_factory=dict)
    ask_attempt_id: int | None = None
    pause: bool = False


@dataclass(frozen=True)
class BudgetStep:
    """A decision of the budget pass. ``claim`` does billing's own bookkeeping for it (a
    warning written, a pause opened or closed) and returns what jobs must do; it runs in the
    transaction in which jobs acts, and returns nothing when another pass claimed it first.
    KIND counts it in the pass's report ("warned", "pausing", "released", "asked")."""

    kind: str
    claim: Callable[[], list[BudgetAction]]


class SpendingGate(Protocol):
    def admit(self, job: Job, *, now: datetime) -> Verdict:
        """At submit, inside the transaction that created JOB."""

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        """Inside the transaction that plans JOB's rent; an allowed verdict holds the cost."""

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        """Before a budget-paused JOB goes back to the queue."""

    def budget_pass(self, *, now: datetime) -> Iterable[BudgetStep]:
        """The steps of one enforcement pass, in order (lazily: each after the last acted)."""


class NoLimits:
    """The gate until billing installs its own: nothing is limited."""

    def admit(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def reserve(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def resume(self, job: Job, *, now: datetime) -> Verdict:
        return ALLOW

    def budget_pass(self, *, now: datetime) -> Iterable[BudgetStep]:
        return ()


_gate: SpendingGate = NoLimits()


def install(gate: SpendingGate) -> None:
    """Make GATE the one that answers (billing's ``AppConfig.ready``)."""
    global _gate
    _gate = gate


def gate() -> SpendingGate:
    """The installed gate."""
    return _gate
