"""What becomes of a rent whose outcome was not a clean create: an instance adopted by its
label (a create whose answer was lost, or whose worker died after Vast accepted it), a claim
whose worker died settled, or the rent given up (the attempt ends, and the job waits its
backoff before the next try, saying "no offers" once).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from hosts import selection
from hosts.vast import (
    Instance,
)
from jobs import (
    lifecycle,
    racers,
)
from jobs.models import Attempt, AttemptState, Job, JobEvent, OfferClaim

logger = logging.getLogger(__name__)


def settle_dead_claim(attempt: Attempt, instance: Instance | None, *, now: datetime) -> str:
    """The process renting ATTEMPT died. INSTANCE is the one Vast holds with its label, if
    any: it is adopted. With none, a create never sent means nothing can exist, and one sent
    ``ADOPT_AFTER_S`` ago or more made nothing: the attempt ends and the job is planned again
    at once (the renting was interrupted, not refused: no backoff). Says what happened."""
    if instance is not None:
        adopt(attempt, instance, now=now)
        return "adopted"
    sent = attempt.create_sent_at
    if sent is not None and (now - sent).total_seconds() < settings.ADOPT_AFTER_S:
        return "waiting"  # the create may still be landing at Vast
    with transaction.atomic():
        ended = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.REQUESTED).update(
            state=AttemptState.ENDED, end_reason="rent_interrupted", ended_at=now
        )
        if ended:
            where = "before asking Vast" if sent is None else "and Vast made no instance"
            lifecycle.record_event(
                attempt.job_id,
                now=now,
                kind="rent_interrupted",
                message=f"the worker renting attempt {attempt.number} stopped {where}; "
                "renting again",
            )
    return "settled" if ended else "not-planned"


def adopt(attempt: Attempt, instance: Instance, *, now: datetime) -> bool:
    """Record INSTANCE, found by ATTEMPT's label, as its rental (a create whose answer was
    lost, or whose worker died after Vast accepted it)."""
    logger.info("adopting instance %s for %s by its label", instance.id, attempt)
    return lifecycle.mark_rented(
        attempt.pk,
        fields=adopted_fields(attempt, instance),
        instance_id=instance.id,
        decision={"adopted": True},
        now=now,
    )


def instance_fields(instance: Instance) -> dict:
    """The attempt's host and rates taken from an adopted instance (no offer was recorded):
    spend and reconciliation need them as much as for a rent that completed normally. A rate
    the instance does not show is None (Vast's documented instance has no traffic prices)."""
    return {
        "machine_id": instance.machine_id,
        "gpu_name": instance.gpu_name or "",
        "dph_base": instance.dph_base,
        "storage_usd_per_gb_hour": instance.storage_usd_per_gb_hour,
        "download_usd_per_gb": instance.download_usd_per_gb,
        "upload_usd_per_gb": instance.upload_usd_per_gb,
        "disk_gb": instance.disk_space_gb or 0.0,
        "rental": selection.INTERRUPTIBLE if instance.is_bid else selection.ON_DEMAND,
    }


RATE_FIELDS = ("dph_base", "storage_usd_per_gb_hour", "download_usd_per_gb", "upload_usd_per_gb")


def adopted_fields(attempt: Attempt, instance: Instance) -> dict:
    """``instance_fields``, with every rate the instance does not show taken from the offer
    recorded when the create was sent (``note_create_sent``), else from the machine's last
    known offer (its newest rental by any job), and only then 0: never a guessed zero while
    a real price is known."""
    fields = instance_fields(instance)
    missing = [name for name in RATE_FIELDS if fields[name] is None]
    if not missing:
        return fields
    known = {name: getattr(attempt, name) for name in missing} if attempt.offer_id else {}
    machine = instance.machine_id or attempt.machine_id
    if len(known) < len(missing) and machine is not None:
        last = (
            Attempt.objects.filter(machine_id=machine, offer_id__isnull=False)
            .exclude(pk=attempt.pk)
            .order_by("-created_at")
            .values(*missing)
            .first()
        )
        known = {**(last or {}), **known}
    return {**fields, **{name: known.get(name) or 0.0 for name in missing}}


def give_up_renting(
    attempt: Attempt, *, now: datetime, why: str, end_reason: str = "no_offers"
) -> str:
    """Close the attempt, keep the job renting, back off with a cap; tell people once."""
    with transaction.atomic():
        ended = Attempt.objects.filter(
            pk=attempt.pk, state__in=[AttemptState.PLANNED, AttemptState.REQUESTED]
        ).update(state=AttemptState.ENDED, end_reason=end_reason, ended_at=now)
        if ended:  # a hedged rent's racers still waiting on their creates end with it
            for racer_id in racers.end_open_racers(attempt.pk, reason=end_reason, now=now):
                lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, racer_id)
            OfferClaim.objects.release(attempt_id=attempt.pk, now=now)
        job = Job.objects.get(pk=attempt.job_id)
        start, cap = settings.RENT_BACKOFF_START_S, settings.RENT_BACKOFF_CAP_S
        backoff = min(max(job.rent_backoff_s * 2, start), cap)
        Job.objects.filter(pk=job.pk).update(
            rent_backoff_s=backoff, next_rent_at=now + timedelta(seconds=backoff)
        )
        if not _no_offers_already_said(job):
            lifecycle.record_event(job.pk, now=now, kind="no_offers", message=why)
    return "no-offers"


def _no_offers_already_said(job: Job) -> bool:
    """True while the current episode (since the last rent) already has a no_offers event."""
    last = (
        JobEvent.objects.filter(job=job, kind__in=["no_offers", "rented"]).order_by("-id").first()
    )
    return last is not None and last.kind == "no_offers"
