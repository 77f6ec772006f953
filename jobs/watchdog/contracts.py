"""Contract ends: a job is moved off a host whose contract ends within ``CONTRACT_MOVE_LEAD_S``,
after one last checkpoint, as a planned move rather than a loss.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from jobs import attention, lifecycle
from jobs.models import Attempt, AttemptState, Checkpoint


def move_off_expiring_contracts(now: datetime) -> int:
    """Move jobs off hosts whose contract ends within ``CONTRACT_MOVE_LEAD_S``: first ask the
    agent for a checkpoint, then, once one newer than the request is ready (or half the lead is
    gone), end the attempt as a planned move (``lifecycle.move_before_contract_end``). Returns how
    many jobs were moved. A job that cannot be moved in time is stopped by the provider and
    recovers as a loss (``provider_stopped``)."""
    lead = timedelta(seconds=settings.CONTRACT_MOVE_LEAD_S)
    expiring = Attempt.objects.filter(
        state=AttemptState.RUNNING, contract_ends_at__isnull=False, contract_ends_at__lte=now + lead
    ).order_by()
    moved = 0
    for attempt in expiring:
        what = "move it off a host whose contract ends"
        with attention.row(job_id=attempt.job_id, what=what, now=now):
            moved += bool(move_off_contract(attempt, now=now, lead=lead))
    return moved


def move_off_contract(attempt: Attempt, *, now: datetime, lead: timedelta) -> bool:
    """One step of moving ATTEMPT off its expiring contract; True when it moved."""
    if attempt.move_asked_at is None:
        ask_checkpoint_before_contract_end(attempt, now=now)
        return False
    return move_is_due(attempt, now=now, lead=lead) and lifecycle.move_before_contract_end(
        attempt.pk, now=now
    )


def move_is_due(attempt: Attempt, *, now: datetime, lead: timedelta) -> bool:
    """A checkpoint asked for the move is ready, or waiting longer would risk the end itself."""
    if attempt.contract_ends_at - now <= lead / 2:
        return True
    return (
        Checkpoint.objects.filter(attempt=attempt, ready_at__gte=attempt.move_asked_at)
        .ready()
        .exists()
    )


def ask_checkpoint_before_contract_end(attempt: Attempt, *, now: datetime) -> None:
    """Ask ATTEMPT's agent for a checkpoint (once) and say why on the job's timeline."""
    if not Attempt.objects.filter(pk=attempt.pk, move_asked_at__isnull=True).update(
        move_asked_at=now
    ):
        return  # another tick asked first
    lifecycle.request_checkpoint(attempt.pk)
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="contract_expiring",
        message=f"the host's contract ends at {attempt.contract_ends_at:%Y-%m-%d %H:%M} UTC: "
        "checkpointing to move before it",
        ends_at=attempt.contract_ends_at.isoformat(),
    )
