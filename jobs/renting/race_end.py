"""A hedged rent's end: the win (the first racer to register gets the attempt, the others are
lost and destroyed), the creates whose outcome the watchdog settles by label, and the destroy
of a racer's instance out of its race.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction

from hosts.vast import VastClient
from jobs import lifecycle, racers, spending
from jobs.models import Attempt, AttemptState, Racer, RacerState
from jobs.rent_decision import RentDecision
from jobs.renting import market
from jobs.renting.race_start import record_instance, void
from jobs.renting.settle import give_up_renting
from nomadgpu.humanize import duration, money

logger = logging.getLogger(__name__)


class RaceOver(Exception):
    """The racer's race is over: another racer won, or the attempt or the racer ended. Its
    agent must stop (the agent API answers 410)."""


# --- The win ---------------------------------------------------------------------------------


def racer_terms(racer: Racer) -> dict:
    """What the winner rented, as the attempt's fields (``creates.offer_fields`` and
    ``rental_fields``, copied at its create, and its disk)."""
    names = (
        "offer_id",
        "machine_id",
        "gpu_name",
        "dph_base",
        "rental",
        "bid_margin",
        "storage_usd_per_gb_hour",
        "download_usd_per_gb",
        "upload_usd_per_gb",
        "disk_gb",
    )
    return {name: getattr(racer, name) for name in names}


def win(racer_id: int, *, now: datetime) -> Attempt:
    """RACER_ID's agent registered first: its instance, token, rates and moment of create
    become the attempt's; every other racer is lost (its token dead) and destroyed after
    commit; the timeline says "raced 2 hosts: kept 21000004 (ready in 71 s), destroyed
    21000005 while loading ($0.00190)". Raises ``RaceOver`` when its race was already over."""
    with transaction.atomic():
        racer = Racer.objects.select_for_update().filter(pk=racer_id).first()
        if racer is None or racer.state != RacerState.RACING:
            over = (racer.end_reason or racer.state) if racer else "no such racer"
        else:
            over = "" if take_attempt(racer, now=now) else "its race is over"
        if over and racer is not None and racer.is_open:
            lost = racers.end_racer(racer, state=RacerState.LOST, reason=over, now=now)
            if lost is not None:
                lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, lost)
    if over:
        raise RaceOver(over)
    return Attempt.objects.select_related("job").get(pk=racer.attempt_id)


def take_attempt(racer: Racer, *, now: datetime) -> bool:
    """The win itself, inside ``win``'s transaction: guarded on the attempt still racing."""
    attempt = Attempt.objects.get(pk=racer.attempt_id)
    taken = Attempt.objects.filter(
        pk=attempt.pk, state=AttemptState.STARTING, instance_id=None
    ).update(
        instance_id=racer.instance_id,
        token_prefix=racer.token_prefix,
        token_digest=racer.token_digest,
        rented_at=racer.rented_at,
        decision=RentDecision.of(attempt).with_chosen(racer.offer_id),
        **racer_terms(racer),
    )
    if not taken:
        return False
    Racer.objects.filter(pk=racer.pk).update(state=RacerState.WON, registered_at=now)
    # Its instance is the attempt's from now on: what it costs is the run's, which the rent's
    # reservation holds; its own hold goes.
    spending.gate().release_racer(
        attempt.job, reserved_usd=racer.reserved_usd, spent_usd=0.0, now=now
    )
    for lost in racers.end_open_racers(attempt.pk, reason="lost the race", now=now):
        lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, lost)
    won = Attempt.objects.select_related("job").get(pk=attempt.pk)
    lifecycle.note_machine_rented(won)
    others = list(won.racers.exclude(pk=racer.pk).exclude(instance_id=None).order_by("position"))
    lifecycle.record_event(
        won.job_id,
        now=now,
        kind="race_won",
        message=won_sentence(Racer.objects.get(pk=racer.pk), others, now=now),
        instance_id=racer.instance_id,
        destroyed=[r.instance_id for r in others],
    )
    return True


# What Vast last showed of a racer's instance, as the timeline says when it was destroyed.
WHILE = {
    "created": "before its host started it",
    "loading": "while loading",
    "running": "while its agent started",
}


def won_sentence(winner: Racer, others: list[Racer], *, now: datetime) -> str:
    """ "raced 2 hosts: kept 21000004 (ready in 71 s), destroyed 21000005 while loading
    ($0.00190)"; a racer that failed on its own reads "21000006 failed (provider_gone,
    $0.000400)". Each cost is billing's (``jobs.spending``: ``billing.spend.racer_spend``)."""
    ready = (now - winner.rented_at).total_seconds() if winner.rented_at else None
    parts = [f"kept {winner.instance_id} (ready in {duration(ready)})"]
    for other in others:
        cost = spending.gate().racer_cost(other, now=now)
        spent = f"{money(cost)}" if cost is not None else ""
        if other.state == RacerState.FAILED:
            why = ", ".join(x for x in (other.end_reason, spent) if x)
            parts.append(f"{other.instance_id} failed ({why})")
            continue
        where = WHILE.get(other.provider_status, "before Vast listed it")
        parts.append(f"destroyed {other.instance_id} {where}" + (f" ({spent})" if spent else ""))
    return f"raced {len(others) + 1} hosts: " + ", ".join(parts)


# --- Creates the watchdog settles, and destroys --------------------------------------------------


def adopt_racer(
    racer: Racer, instance_id: int | None, *, now: datetime, claimer_dead: bool = False
) -> str:
    """A racer whose create's outcome is unknown, as the watchdog finds it: after
    ``ADOPT_AFTER_S`` (at once when the rent's worker died: CLAIMER_DEAD) its instance, found
    by its label, races, opening its attempt's race if none did; with none after
    ``REQUESTED_GRACE_S`` (``ADOPT_AFTER_S`` for a dead worker) it is void. Says what happened."""
    waited = (now - (racer.create_sent_at or racer.created_at)).total_seconds()
    if waited < settings.ADOPT_AFTER_S and not claimer_dead:
        return "waiting"  # the rent that sent it may be recording it now
    if instance_id is not None:
        attempt = Attempt.objects.select_related("job").get(pk=racer.attempt_id)
        logger.info("adopting instance %s for %s by its label", instance_id, racer)
        return "adopted" if record_instance(attempt, racer, instance_id, now=now) else "late"
    grace = settings.ADOPT_AFTER_S if claimer_dead else settings.REQUESTED_GRACE_S
    if waited >= grace:
        void(racer, "create_never_completed", now=now)
        return "void"
    return "waiting"


def settle_requested_race(
    attempt: Attempt, by_label: dict, *, now: datetime, claimer_dead: bool = False
) -> str:
    """An attempt still requested with racers (none seen to make an instance yet): each is
    adopted by its label or voided (``adopt_racer``); with none left in the race, the rent is
    given up (its backoff). Says what happened."""
    for racer in attempt.racers.open().order_by("position"):
        found = by_label.get(racer.label)
        instance_id = found.id if found is not None else None
        adopt_racer(racer, instance_id, now=now, claimer_dead=claimer_dead)
    attempt.refresh_from_db()
    if attempt.state == AttemptState.REQUESTED and not attempt.racers.open().exists():
        return give_up_renting(attempt, now=now, why="no racer's create made an instance")
    return "settled"


def destroy_racer_instance(
    racer_id: int, *, now: datetime, client: VastClient | None = None
) -> bool:
    """Destroy the instance of a racer out of its race, and note when (the task after a win, a
    failure or an attempt's end). Never a racer still in its race. False: nothing to do."""
    racer = Racer.objects.select_related("attempt__job__team").filter(pk=racer_id).first()
    if racer is None or racer.is_open or racer.instance_id is None or racer.destroyed_at:
        return False
    if racer.state == RacerState.WON:
        return False  # its instance is the attempt's, destroyed with it
    with market.team_client(racer.attempt.job.team, client=client) as vast:
        vast.destroy_instance(racer.instance_id)
    Racer.objects.filter(pk=racer_id, destroyed_at=None).update(destroyed_at=now)
    return True
