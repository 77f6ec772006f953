"""Rows that need a person. One bad row never stops a pass: the watchdog's losses, accounts,
contract moves and plans are each their own unit (STYLE: "one bad row pushes its own deadline
back; it never stops the loop"). And a job whose stored spec no longer validates (JSON edited
by hand in the admin) is held until it is fixed (``hold_if_spec_invalid``,
``requeue_if_fixed``), instead of failing every rent the same way.

``guarded`` runs one row's work. An exception is logged with the row's id, written once as a
``supervisor_error`` event on its job (the same error again on the next tick is not written
again), and the pass goes on. The rows failing lately are kept on the ``attention``
``ServiceHeartbeat`` (``record_pass``), which the status page counts ("1 job needs
attention") without naming them. A lost database connection is not a row's fault: it
still ends the pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import InterfaceError, OperationalError, transaction

from jobs import lifecycle, market_terms
from jobs.models import Job, JobEvent, JobState
from nomadgpu.models import ServiceHeartbeat

logger = logging.getLogger(__name__)

ATTENTION = "attention"
EVENT = "supervisor_error"
T = TypeVar("T")

_failed_jobs: set[int] = set()
_failed_accounts: dict[str, str] = {}


def guarded(
    func: Callable[..., T], *args, now: datetime, job_id: int | None, what: str, **kwargs
) -> T | None:
    """FUNC(*ARGS, now=NOW, **KWARGS) for the row of JOB_ID; None when it raised (logged and
    noted on the job, see the module docstring). WHAT says what was being done to the job."""
    try:
        return func(*args, now=now, **kwargs)
    except (OperationalError, InterfaceError):
        raise  # the database itself: every row would fail the same way
    except Exception as exc:
        logger.exception("watchdog: could not %s for job %s", what, job_id)
        if job_id is not None:
            _failed_jobs.add(job_id)
            note_on_job(job_id, f"the supervisor could not {what}: {describe(exc)}", now=now)
        return None


def describe(exc: BaseException) -> str:
    """An exception as one line a person can act on."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:400] if text else type(exc).__name__


def note_on_job(job_id: int, message: str, *, now: datetime) -> None:
    """A ``supervisor_error`` event on JOB_ID, unless its newest one says the same already."""
    try:
        with transaction.atomic():
            last = (
                JobEvent.objects.filter(job_id=job_id, kind=EVENT)
                .order_by("-id")
                .values_list("message", flat=True)
                .first()
            )
            if last != message:
                JobEvent.objects.record(job_id, now=now, kind=EVENT, message=message, data={})
    except Exception:
        logger.exception("could not record the error of job %s", job_id)


def account_failed(account: str, why: str) -> None:
    """A provider account (a team's Vast key) could not be polled: kept for this pass's
    supervisor-health line, never on the public page."""
    _failed_accounts[account] = why[:300]


def begin_pass() -> None:
    """Forget what an earlier pass that ended with an exception left noted."""
    _failed_jobs.clear()
    _failed_accounts.clear()


# A failed row is tried again about a minute later (``jobs.watchdog.FAILED_ROW_RETRY``): it
# counts as failing until it has not failed again for this long.
FAILING_FOR = timedelta(seconds=150)


def record_pass(*, now: datetime) -> dict:
    """Keep which rows are failing: those that failed in the pass that just ended, and those
    that failed within ``FAILING_FOR`` (a failed row is not retried every pass). Forgets this
    pass's notes for the next."""
    beat = ServiceHeartbeat.objects.filter(name=ATTENTION).first()
    before = (beat.detail.get("failed_at") or {}) if beat else {}
    cutoff = (now - FAILING_FOR).isoformat()
    failed_at = {job: at for job, at in before.items() if at >= cutoff}
    failed_at.update({str(job): now.isoformat() for job in _failed_jobs})
    detail = {
        "jobs": sorted(int(job) for job in failed_at),
        "failed_at": failed_at,
        "accounts": dict(sorted(_failed_accounts.items())),
    }
    _failed_jobs.clear()
    _failed_accounts.clear()
    ServiceHeartbeat.objects.update_or_create(
        name=ATTENTION, defaults={"last_seen_at": now, "detail": detail}
    )
    return detail


def failed_in_last_pass() -> dict:
    """``{"jobs": [ids], "accounts": {account: why}}``: the rows failing as of the newest
    pass."""
    beat = ServiceHeartbeat.objects.filter(name=ATTENTION).first()
    return beat.detail if beat else {"jobs": [], "accounts": {}}


def hold_if_spec_invalid(job: Job, *, now: datetime) -> bool:
    """Hold JOB for attention when its stored requirements, profile or env no longer fit
    ``JobSpec``: one event names each field ("requirements: unknown key 'gpu_name'"). True
    when it was held (nothing should rent it)."""
    try:
        market_terms.validate_stored(job)
    except market_terms.StoredSpecInvalid as exc:
        why = (
            f"needs attention: {exc}. Fix the job in the admin (it is queued again once it "
            "validates) or cancel it"
        )
        data = {"fields": list(exc.fields), "problems": [p for _, p in exc.problems]}
        try:
            lifecycle.hold_for_attention(job.pk, why=why, data=data, now=now)
        except lifecycle.IllegalTransition:
            return False  # it moved on meanwhile (cancelled, say)
        return True
    return False


def requeue_if_fixed(job: Job, *, by: str, now: datetime) -> bool:
    """Queue JOB again when it was held for attention and now validates; says whether."""
    if job.state != JobState.NEEDS_ATTENTION:
        return False
    try:
        market_terms.validate_stored(job)
    except market_terms.StoredSpecInvalid:
        return False
    try:
        lifecycle.requeue_after_fix(job.pk, by=by, now=now)
    except lifecycle.IllegalTransition:
        return False
    return True
