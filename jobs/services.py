"""The job state machine: every transition is one function here.

Each claims the job row with a guarded update (``filter(pk=, state__in=allowed).update(...)``,
exactly one row or the transition is refused), writes a ``JobEvent``, and defers side effects
(provider calls, renting) with ``transaction.on_commit`` so nothing happens for a transaction
that rolled back. Illegal transitions raise ``IllegalTransition``; they are never ignored.

    queued → renting → starting → running → (recovering → renting …)
           → succeeded | failed | cancelled | paused_budget
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from jobs.models import Attempt, Checkpoint, Job, JobEvent, JobState

# One console line per job event: what an operator watching `make run` wants to see.
event_log = logging.getLogger("nomadgpu.events")
S = JobState
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
ALLOWED_FROM: dict[str, frozenset[str]] = {
    S.RENTING: frozenset({S.QUEUED, S.RECOVERING, S.RENTING}),
    S.STARTING: frozenset({S.RENTING}),
    S.RUNNING: frozenset({S.STARTING}),
    S.RECOVERING: frozenset({S.STARTING, S.RUNNING}),
    S.SUCCEEDED: frozenset({S.STARTING, S.RUNNING}),
    S.FAILED: frozenset({S.QUEUED, S.RENTING, S.STARTING, S.RUNNING, S.RECOVERING}),
    S.CANCELLED: frozenset(
        {S.QUEUED, S.RENTING, S.STARTING, S.RUNNING, S.RECOVERING, S.PAUSED_BUDGET}
    ),
    S.PAUSED_BUDGET: frozenset({S.QUEUED, S.RENTING, S.STARTING, S.RUNNING, S.RECOVERING}),
    S.QUEUED: frozenset({S.PAUSED_BUDGET}),
}


class IllegalTransition(Exception):
    """The job is not in a state from which this transition is allowed."""

    def __init__(self, job_id: int, to: str, current: str | None) -> None:
        self.job_id, self.to, self.current = job_id, to, current
        super().__init__(f"job {job_id} cannot go to {to} from {current or 'nowhere'}")


def transition(
    job_id: int,
    to: str,
    *,
    now: datetime,
    kind: str,
    message: str = "",
    data: dict | None = None,
    **fields,
) -> JobEvent:
    """Move JOB_ID to TO if its current state allows it; record why; return the event.

    Must run inside a transaction (the caller's), so the state, the event and any deferred
    side effects commit together.
    """
    allowed = ALLOWED_FROM[to]
    claimed = Job.objects.filter(pk=job_id, state__in=allowed).update(
        state=to, updated_at=now, **fields
    )
    if claimed != 1:
        current = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
        raise IllegalTransition(job_id, to, current)
    return _notify(
        JobEvent.objects.create(
            job_id=job_id, created_at=now, kind=kind, message=message, data=data or {}
        )
    )


def record_event(job_id: int, *, now: datetime, kind: str, message: str = "", **data) -> JobEvent:
    """An event that does not change state (no offers, budget warning, checkpoint ready)."""
    return _notify(
        JobEvent.objects.create(
            job_id=job_id, created_at=now, kind=kind, message=message, data=data
        )
    )


def _notify(event: JobEvent) -> JobEvent:
    """Outbox rows in the event's own transaction; a worker sends them after commit."""
    from notify import outbox
    from notify import tasks as notify_tasks

    transaction.on_commit(lambda: _log_event(event))
    if outbox.enqueue_for_event(event):
        # robust: a broker that is down must not undo the commit; beat sweeps the outbox.
        transaction.on_commit(notify_tasks.deliver_due.delay, robust=True)
    return event


def _log_event(event: JobEvent) -> None:
    level = logging.WARNING if event.kind in WARNING_EVENTS else logging.INFO
    text = f"job {event.job_id}: {event.kind.replace('_', ' ')}"
    event_log.log(level, f"{text}: {event.message}" if event.message else text)


WARNING_EVENTS = frozenset({"host_lost", "failed", "no_offers", "budget_paused"})


def is_terminal(state: str) -> bool:
    return state in TERMINAL


def after_commit(func, *args, **kwargs) -> None:
    """Run FUNC once the current transaction commits (side effects never precede the state)."""
    transaction.on_commit(lambda: func(*args, **kwargs))


def submit_job(*, team, created_by, now: datetime, **fields) -> Job:
    """Create a queued job and ask for a host after commit (the watchdog would find it too).

    Raises ``billing.services.BudgetExceeded`` (nothing created) when the job's estimated cost
    would cross a spending limit and the submitter did not ask to wait for the budget."""
    from billing.services import preflight
    from jobs import renting

    with transaction.atomic():
        job = Job.objects.create(
            team=team, created_by=created_by, state=S.QUEUED, created_at=now, **fields
        )
        if job.encrypt_checkpoints and not job.data_key:
            from jobs.agent_services import new_data_key

            job.data_key = new_data_key()
            job.save(update_fields=["data_key"])
        preflight(job, now=now)
        record_event(job.pk, now=now, kind="submitted", message=f"submitted by {created_by}")
        after_commit(renting.plan_rent, job.pk, now=now)
    return job


def newest_ready_step(job_id: int) -> int | None:
    """The step of JOB_ID's newest ready checkpoint (what a resume starts from), or None."""
    return (
        Checkpoint.objects.filter(job_id=job_id, state="ready")
        .order_by("-step")
        .values_list("step", flat=True)
        .first()
    )


def request_checkpoint(attempt_id: int) -> None:
    """Have ATTEMPT_ID's next heartbeat answer ``checkpoint_now``; a pending ``stop`` (a fenced
    agent) is never replaced by it."""
    Attempt.objects.filter(pk=attempt_id, pending_command="").update(
        pending_command="checkpoint_now"
    )
