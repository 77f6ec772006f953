"""Hedged rents as the provider poll sees them (``jobs.renting.race``): each racer of an open race
against Vast's instance list, and the instances of racers out of their race.

- A racer whose create's outcome is unknown is adopted by its label, or voided after grace
  (``race_end.adopt_racer``).
- A racing racer's host that fails on its own (gone, exited, offline, unknown twice, its
  container runtime failed, given up before running: ``instance_status.provider_loss``, the
  rules an attempt's host is judged by) fails the racer: its instance is destroyed and its
  machine blamed (the job avoids it). The others race on.
- A racing racer with no agent by its own start deadline (``start_due.racer_due``: its machine's
  link and image, pushed by what Vast shows of its instance, as a plain rent's host) fails the
  same way (``start_overdue``), checked at each poll; the others race on. The attempt's own
  start deadline is the latest of its open racers' (``start_due.race_due``): the job page shows
  it, and the watchdog's deadline pass ends the race by it should the poll be unable to.
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
from jobs.watchdog import silence, start_due
from jobs.watchdog.deadlines import START_OVERDUE
from jobs.watchdog.instance_status import provider_loss
from jobs.watchdog.outages import gather_evidence
from jobs.watchdog.start_deadline import Due, overdue_detail

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
    dues: dict[int, Due] = {}
    evidence: list[silence.Evidence] = []  # read once, only when a racer is overdue
    for racer in attempt.racers.open().order_by("position"):
        if racer.state == RacerState.REQUESTED:
            found = by_label.get(racer.label)
            race_end.adopt_racer(racer, found.id if found else None, now=now)
            continue
        instance = by_id.get(racer.instance_id)
        status = (instance.actual_status or "") if instance else "gone"
        msg = ((instance.status_msg or "") if instance else "")[:500]
        due = start_due.note_racer_news(attempt, racer, status, msg, now=now)
        note_racer_status(racer, instance, now=now)
        loss = provider_loss(racer, instance)
        if loss is None and due is not None and due.at <= now:
            evidence = evidence or [gather_evidence()]
            loss = overdue_loss(attempt, racer, due, status=status, evidence=evidence[0], now=now)
        if loss is not None:
            fail_racer(attempt, racer, loss, now=now)
            last = loss
        elif due is not None:
            dues[racer.position] = due
    if attempt.racers.open().exists():
        start_due.race_due(attempt, dues)
        return None
    if not Attempt.objects.filter(
        pk=attempt.pk, state=AttemptState.STARTING, instance_id=None
    ).exists():
        return None  # won meanwhile, or ended
    failed = list(attempt.racers.exclude(instance_id=None).order_by("position"))
    said = "; ".join(f"{r.instance_id} {r.end_reason}" for r in failed) or "none made"
    cause = last.cause if last else (failed[-1].end_reason if failed else "never_registered")
    return Loss(attempt.pk, cause, f"every racer failed to start: {said}"[:300])


def overdue_loss(
    attempt: Attempt,
    racer: Racer,
    due: Due,
    *,
    status: str,
    evidence: silence.Evidence,
    now: datetime,
) -> Loss | None:
    """RACER past its own start deadline DUE with no agent (its instance STATUS as the poll
    read it): a start that failed on its own (``start_overdue``, or ``never_registered`` when the
    job's start timeout set the deadline), unless an outage of the agent API since its create
    kept its agent from registering (``silence.start_verdict``, as a plain rent's host)."""
    verdict = silence.start_verdict(
        rented_at=racer.rented_at,
        start_timeout_s=(due.at - racer.rented_at).total_seconds(),
        evidence=evidence,
        now=now,
    )
    if verdict.kind != silence.LOST:
        return None
    if due.capped:
        why = f"no agent within the job's {attempt.job.start_timeout_s} s start timeout"
        return Loss(attempt.pk, "never_registered", why)
    detail = overdue_detail(due, rented_at=racer.rented_at, provider_status=status, now=now)
    return Loss(attempt.pk, START_OVERDUE, detail)


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
