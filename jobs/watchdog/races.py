"""Hedged rents as the provider poll sees them (``jobs.renting.race``): each racer of an open race
against Vast's instance list, and the instances of racers out of their race.

- A racer whose create's outcome is unknown is adopted by its label, or voided after grace
  (``race_end.adopt_racer``).
- A racing racer's host that fails on its own (gone, exited, offline, unknown twice, its
  container runtime failed, given up before running: ``instance_status.provider_loss``, the
  rules an attempt's host is judged by) fails the racer: its instance is destroyed and its
  machine blamed (the job avoids it). The others race on.
- When every racer has failed, the attempt is lost (its cause the last racer's) and the same
  pass plans the next race on the next offers, with no backoff: a race where all fail goes on.
- What Vast shows is kept on each racer: its status, and when it was first seen loading and
  running (its image pull is billed from the first, its GPU from the second: ``billing.spend``).

While its race is open a racer's label and instance are owned (the orphan reaper leaves them);
a labelled instance of a racer out of its race is destroyed at once, with no grace
(``sweep_racers``): the row says it is not wanted.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F

from hosts.vast import Instance, VastClient, VastError
from jobs import lifecycle, racers
from jobs.lifecycle import Loss
from jobs.models import Attempt, AttemptState, Racer, RacerState
from jobs.renting import claims, race_end
from jobs.watchdog.instance_status import provider_loss

logger = logging.getLogger(__name__)


def is_racing(attempt: Attempt) -> bool:
    """Whether ATTEMPT's race is open: starting, racers created, no instance of its own yet."""
    return attempt.raced > 0 and attempt.instance_id is None


def settle_requested(attempt: Attempt, by_label: dict[str, Instance], *, now: datetime) -> None:
    """A requested attempt with racers: their creates adopted by label, or voided after grace
    (at once, or after ``ADOPT_AFTER_S``, when the rent's worker died)."""
    race_end.settle_requested_race(
        attempt, by_label, now=now, claimer_dead=claims.claim_is_dead(attempt, now=now)
    )


def follow_race(
    attempt: Attempt, by_id: dict[int, Instance], by_label: dict[str, Instance], *, now: datetime
) -> Loss | None:
    """Each racer of ATTEMPT's open race against the provider's view (module docstring); the
    attempt's loss when every racer has failed."""
    last: Loss | None = None
    for racer in attempt.racers.open().order_by("position"):
        if racer.state == RacerState.REQUESTED:
            found = by_label.get(racer.label)
            race_end.adopt_racer(racer, found.id if found else None, now=now)
            continue
        instance = by_id.get(racer.instance_id)
        note_racer_status(racer, instance, now=now)
        loss = provider_loss(racer, instance)
        if loss is not None:
            fail_racer(attempt, racer, loss, now=now)
            last = loss
    if attempt.racers.open().exists():
        return None
    if not Attempt.objects.filter(
        pk=attempt.pk, state=AttemptState.STARTING, instance_id=None
    ).exists():
        return None  # won meanwhile, or ended
    failed = list(attempt.racers.exclude(instance_id=None).order_by("position"))
    said = "; ".join(f"{r.instance_id} {r.end_reason}" for r in failed) or "none made"
    cause = last.cause if last else (failed[-1].end_reason if failed else "never_registered")
    return Loss(attempt.pk, cause, f"every racer failed to start: {said}"[:300])


def fail_racer(attempt: Attempt, racer: Racer, loss: Loss, *, now: datetime) -> None:
    """RACER's host failed on its own: out of the race, destroyed, its machine blamed."""
    with transaction.atomic():  # its end and its event together; the destroy after commit
        ended = racers.end_racer(
            racer, state=RacerState.FAILED, reason=loss.cause, now=now, blame=True
        )
        if ended is None:
            return
        lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, ended)
        left = attempt.racers.open().count()
        lifecycle.record_event(
            attempt.job_id,
            now=now,
            kind="racer_failed",
            message=f"racer {racer.position} (instance {racer.instance_id}, machine "
            f"{racer.machine_id}) failed: {loss.cause}"
            + (f" ({loss.detail})" if loss.detail else "")
            + (f"; {left} still racing" if left else "; no racer left"),
            instance_id=racer.instance_id,
            cause=loss.cause,
        )


def note_racer_status(racer: Racer, instance: Instance | None, *, now: datetime) -> None:
    """Keep what the provider last said of RACER's instance, and when it was first seen
    loading (pulling its image) and running (the GPU bills)."""
    status = instance.actual_status if instance else "gone"
    fields = {
        "provider_status": status or "",
        "provider_status_msg": ((instance.status_msg or "") if instance else "")[:500],
        "provider_unknown_polls": F("provider_unknown_polls") + 1 if status == "unknown" else 0,
    }
    if status in ("loading", "running") and racer.loading_at is None:
        fields["loading_at"] = now
    if status == "running" and racer.running_at is None:
        fields["running_at"] = now
    Racer.objects.filter(pk=racer.pk).update(**fields)


def owned_by_races(attempts: list[Attempt]) -> set:
    """The labels and instances of the open racers of ATTEMPTS (live): the reaper's to leave."""
    open_racers = Racer.objects.open().filter(attempt__in=[a for a in attempts if a.raced])
    owned: set = set()
    for label, instance_id in open_racers.values_list("label", "instance_id"):
        owned.add(label)
        if instance_id is not None:
            owned.add(instance_id)
    return owned


def sweep_racers(
    client: VastClient, instances: list[Instance], owned: set, *, now: datetime
) -> set[int]:
    """Destroy at once every listed instance of a racer out of its race (or of an attempt that
    ended): its row says it is not wanted, so no orphan grace applies. The ones destroyed."""
    labelled = {
        i.label: i for i in instances if i.label and i.id not in owned and i.label not in owned
    }
    destroyed: set[int] = set()
    if not labelled:
        return destroyed
    for racer in Racer.objects.filter(label__in=list(labelled)).exclude(state=RacerState.WON):
        instance = labelled[racer.label]
        if racer.is_open:  # its attempt ended without ending it: out of the race now
            racers.end_racer(racer, state=RacerState.LOST, reason="attempt ended", now=now)
        logger.warning("destroying %s's instance %s: out of its race", racer, instance.id)
        try:
            client.destroy_instance(instance.id)
        except VastError as exc:
            logger.warning("could not destroy %s's instance %s: %s", racer, instance.id, exc)
            continue
        Racer.objects.filter(pk=racer.pk).update(destroyed_at=now)
        Racer.objects.filter(pk=racer.pk, instance_id=None).update(instance_id=instance.id)
        destroyed.add(instance.id)
    return destroyed
