"""Rentals of a known machine through the state machine, for the tests of the team's memory of
machines: ``rented_on`` rents one (``lifecycle.mark_rented`` opens its record), ``lose`` loses
it (``lifecycle.handle_loss`` charges the machine, or says why not)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from hosts.models import MachineRental
from jobs import lifecycle
from jobs.models import Attempt, JobState
from tests.support.factories import JobFactory, make_attempt

DECISION = {  # what a rent stores of the chosen offer (selection.Decision.as_dict), in short
    "chosen": {
        "offer": {"id": 7, "inet_down_mbps": 800.0, "reliability": 0.99},
        "cost": {"seconds_per_step": 4.0, "speed_source": "dlperf", "machine_speed_factor": 1.0},
    }
}


def rented_on(machine: int, *, at: datetime | None = None, job=None, **fields) -> Attempt:
    """An attempt of JOB (a new one) rented on MACHINE at AT (now); FIELDS are set after."""
    at = at or timezone.now()
    job = job or JobFactory(state=JobState.RENTING)
    attempt, _ = make_attempt(job, state="requested")
    offer = {"machine_id": machine, "gpu_name": "RTX 4090", "offer_id": 7, "dph_base": 0.3}
    chosen = {**DECISION["chosen"], "offer": {**DECISION["chosen"]["offer"], "machine_id": machine}}
    assert lifecycle.mark_rented(
        attempt.pk,
        fields=offer,
        instance_id=attempt.pk + 21_000_000,
        decision={**DECISION, "chosen": chosen},
        now=at,
    )
    if fields:
        Attempt.objects.filter(pk=attempt.pk).update(**fields)
    attempt.refresh_from_db()
    return attempt


def lose(attempt: Attempt, cause: str, *, at: datetime | None = None) -> MachineRental:
    """ATTEMPT's host lost to CAUSE at AT (now); its machine's rental record after."""
    assert lifecycle.handle_loss(lifecycle.Loss(attempt.pk, cause), now=at or timezone.now())
    return MachineRental.objects.get(attempt_id=attempt.pk)
