"""Rows that need a person. One bad row never stops a pass: the watchdog's losses, accounts,
contract moves and plans are each their own unit (STYLE: "one bad row pushes its own deadline
back; it never stops the loop"). And a job whose stored spec no longer validates (JSON edited
by hand in the admin) is held until it is fixed (``hold_if_spec_invalid``,
``requeue_if_fixed``), instead of failing every rent the same way.

``with attention.row(job_id=..., what=..., now=...) as row:`` runs one row's work, the guard
visible at the call site (healthchecks' ``sendalerts`` handles one check per call, its
try/except right there). An exception inside is logged with the row's id, written once as a
``supervisor_error`` event on its job (the same error again on the next tick is not written
again), ``row.failed`` is set, and the pass goes on. The rows failing lately are kept on the
``attention`` ``ServiceHeartbeat`` (``record_pass``), which the status page counts ("1 job
needs attention") without naming them. A lost database connection is not a row's fault: it
still ends the pass.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import InterfaceError, OperationalError, transaction

from jobs import lifecycle, stored_spec
from jobs.models import Job, JobEvent, JobState
from nomadgpu.models import ServiceHeartbeat

logger = logging.getLogger(__name__)

ATTENTION = "attention"
EVENT = "supervisor_error"

_failed_jobs: set[int] = set()
_failed_accounts: dict[str, str] = {}


class Row:
    """One row's work in a pass (``row``): an exception raised inside is logged, noted on the
    row's job and swallowed; ``failed`` says whether that happened. A lost database connection
    is not the row's fault: it propagates and ends the pass."""

    def __init__(self, *, job_id: int | None, what: str, now: datetime) -> None:
        self.job_id, self.what, self.now = job_id, what, now
        self.failed = False

    def __enter__(self) -> Row:
        return self

    def __exit__(self, kind, exc, traceback) -> bool:
        if exc is None or isinstance(exc, OperationalError | InterfaceError):
            return False  # the database itself: every row would fail the same way
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit: not a row's fault either
        logger.error(
            "watchdog: could not %s for job %s",
            self.what,
            self.job_id,
            exc_info=(kind, exc, traceback),
        )
        self.failed = True
        if self.job_id is not None:
            _failed_jobs.add(self.job_id)
            note_on_job(
                self.job_id, f"the supervisor could not {self.what}: {describe(exc)}", now=self.now
            )
        return True


def row(*, job_id: int | None, what: str, now: datetime) -> Row:
    """The guard of one row's work, for a ``with`` block: see ``Row``. WHAT says what is being
    done to the job of JOB_ID ("handle its host's loss")."""
    return Row(job_id=job_id, what=what, now=now)


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


# A failed row is tried again about a minute later (``jobs.watchdog.passes.FAILED_ROW_RETRY``): it
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
        stored_spec.validate_stored(job)
    except stored_spec.StoredSpecInvalid as exc:
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
        stored_spec.validate_stored(job)
    except stored_spec.StoredSpecInvalid:
        return False
    try:
        lifecycle.requeue_after_fix(job.pk, by=by, now=now)
    except lifecycle.IllegalTransition:
        return False
    return True
