"""A racer of a hedged rent leaving its race (``jobs.models.racer``): lost (another won, or its
attempt ended), failed on its own, or void (its create made nothing). Its offer claim and its
budget hold are released (what it spent stays the job's: ``jobs.spending``), and a racer whose
host failed on its own is blamed as a lost host is: its machine joins the job's avoid list,
counts against the machine for every job, and is a rental that never got ready in the team's
memory of machines (``machine_incidents.note_racer_failure``).

No provider call and no task here (``jobs.lifecycle`` imports this module): each function
returns the racers whose instances are to be destroyed, and its caller sends their destroys
after commit (``lifecycle.enqueue`` of ``DESTROY_RACER_TASK``, which records when each is gone).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import F

from hosts.models import Machine
from jobs import machine_incidents, spending
from jobs.models import OPEN_RACER_STATES, Job, OfferClaim, Racer, RacerState


def end_racer(
    racer: Racer, *, state: str, reason: str, now: datetime, blame: bool = False
) -> int | None:
    """Move an open RACER to STATE (lost, failed or void) for REASON; with BLAME its machine is
    held against it. Returns its id when it has an instance to destroy; None when it had none
    or had ended already (guarded: a racer leaves its race once)."""
    # One transaction: the racer leaves, its claim and hold go and its machine is blamed
    # together or not at all (the watchdog calls this outside any transaction of its own).
    with transaction.atomic():
        ended = Racer.objects.filter(pk=racer.pk, state__in=OPEN_RACER_STATES).update(
            state=state, end_reason=reason[:40], ended_at=now
        )
        if not ended:
            return None
        racer = Racer.objects.select_related("attempt__job").get(pk=racer.pk)
        OfferClaim.objects.release(racer_id=racer.pk, now=now)
        gate = spending.gate()
        spent = gate.racer_cost(racer, now=now) or 0.0
        gate.release_racer(
            racer.attempt.job, reserved_usd=racer.reserved_usd, spent_usd=spent, now=now
        )
        if blame:
            blame_machine(racer.attempt.job_id, racer.machine_id)
            machine_incidents.note_racer_failure(racer, cause=reason, now=now)
    return racer.pk if racer.instance_id is not None else None


def end_open_racers(
    attempt_id: int, *, reason: str, now: datetime, blame: bool = False
) -> list[int]:
    """Every racer of ATTEMPT_ID still in its race leaves it (its attempt ended, or its race
    was won: lost; at a start timeout, with BLAME, each failed; one whose create was never seen
    is void); the racers whose instances are to be destroyed."""
    found = []
    for racer in Racer.objects.open().filter(attempt_id=attempt_id).order_by("position"):
        made = racer.instance_id is not None  # a create never seen made nothing to blame
        state = RacerState.VOID if not made else RacerState.FAILED if blame else RacerState.LOST
        ended = end_racer(racer, state=state, reason=reason, now=now, blame=blame and made)
        if ended is not None:
            found.append(ended)
    return found


def blame_machine(job_id: int, machine_id: int | None) -> None:
    """A racer's host failed on its own: the job avoids MACHINE_ID from now on, and it counts
    against the machine for every job (as ``lifecycle.remember_bad_machine`` for an attempt)."""
    if machine_id is None:
        return
    with transaction.atomic():  # the row lock lives as long as this block
        job = Job.objects.select_for_update().get(pk=job_id)
        if machine_id not in job.avoid_machine_ids:
            Job.objects.filter(pk=job_id).update(
                avoid_machine_ids=[*job.avoid_machine_ids, machine_id]
            )
        Machine.objects.filter(machine_id=machine_id).update(interruptions=F("interruptions") + 1)
