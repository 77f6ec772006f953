"""Renting a host for a job, exactly once.

1. ``lifecycle.plan_rent`` commits an ``Attempt`` row (PLANNED) before any provider call. A
   partial unique index allows one live attempt per job, so two workers cannot both plan one.
2. ``rent`` (this module, the ``rent_attempt`` task) claims PLANNED → REQUESTED (with the agent
   token's digest) and commits, then asks ``hosts`` to choose an offer and creates the instance
   labelled ``ngpu:<env>:<job>:<n>``. A create whose outcome is unknown is never repeated: the
   watchdog adopts the instance by its label, or closes the attempt after a grace period.
3. ``lifecycle.mark_rented`` stores the instance on the attempt and moves the job to
   ``starting``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F

from hosts import selection
from hosts.vast import (
    CreateOutcomeUnknown,
    Instance,
    InsufficientCredit,
    Offer,
    OfferGone,
    OfferRefused,
    VastClient,
    VastError,
)
from jobs import (
    attention,
    image_cache,
    lifecycle,
    market_terms,
    measured,
    rent_claims,
)
from jobs.bootstrap import render_bootstrap
from jobs.code import job_secrets
from jobs.market_terms import profile_for, requirements_for
from jobs.models import Attempt, AttemptState, Job, JobEvent
from nomadgpu.tokens import issue_token

logger = logging.getLogger(__name__)

MAX_CREATE_TRIES = 5


def parse_label(label: str | None) -> tuple[int, int] | None:
    """(job id, attempt number) from one of our labels in this environment, else None."""
    prefix = f"ngpu:{settings.NOMADGPU_ENV}:"
    if not label or not label.startswith(prefix):
        return None
    try:
        job_id, number = label[len(prefix) :].split(":")
        return int(job_id), int(number)
    except ValueError:
        return None


def speed_book(
    job: Job, offers: list[Offer], history: measured.History | None = None
) -> selection.SpeedBook:
    """Seconds per step this job and the team's earlier runs of its shape showed on machines
    and GPU models (``measured.measured_speeds``: medians of the newest), and DLPerf for the
    rest, from those runs' offers and the market's."""
    history = history if history is not None else measured.history_for(job)
    return history.speeds.book().with_market(offers, requirements_for(job).num_gpus)


def rent(attempt_id: int, *, now: datetime, client: VastClient | None = None) -> str:
    """Claim a planned attempt, choose an offer and create its instance; say what happened.

    Any unexpected error before Vast accepted a create closes the attempt at once and backs
    the job off (``give_up_renting``), so the job is rented again at its next turn instead of
    holding a ``requested`` attempt until ``REQUESTED_GRACE_S``. An error after the create was
    accepted leaves the attempt ``requested``: the instance exists and carries the attempt's
    label, so the watchdog adopts it after ``ADOPT_AFTER_S`` rather than paying for a second one.
    """
    token = issue_token()
    claimed = Attempt.objects.filter(pk=attempt_id, state=AttemptState.PLANNED).update(
        state=AttemptState.REQUESTED,
        requested_at=now,
        rent_claimed_by=rent_claims.this_process(),
        token_prefix=token.prefix,
        token_digest=token.digest,
    )
    if not claimed:
        # A duplicate message, the job cancelled meanwhile, or this message again after the
        # worker that claimed it died (``reject_on_worker_lost``): that claim is settled now.
        return settle_if_claimer_died(attempt_id, now=now, client=client)
    attempt = Attempt.objects.select_related("job__team").get(pk=attempt_id)
    own_client = client is None
    try:
        client = client or VastClient.from_settings(attempt.job.team)
        return _choose_and_create(attempt, token.token, client=client, now=now)
    except market_terms.StoredSpecInvalid:
        # Edited into something no rent can use since it was planned: held, not retried.
        attention.hold_if_spec_invalid(attempt.job, now=now)
        return "needs-attention"
    except SoftTimeLimitExceeded:
        # The task's time ran out, maybe mid-create: the outcome is unknown, so the attempt
        # stays requested and the watchdog adopts its labelled instance or closes it later.
        logger.warning("renting %s ran out of time; adopting by label if it was created", attempt)
        return "unknown"
    except Exception as exc:
        logger.exception("renting %s failed", attempt)
        why = f"renting failed ({type(exc).__name__}: {exc}); trying again"
        return give_up_renting(attempt, now=now, why=why, end_reason="rent_error")
    finally:
        if own_client and client is not None:
            client.close()


def _choose_and_create(attempt: Attempt, token: str, *, client: VastClient, now: datetime) -> str:
    job = attempt.job
    history = measured.history_for(job)
    req, profile = requirements_for(job), profile_for(job, history)
    try:
        offers = client.search_offers(
            selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
        )
    except VastError as exc:
        return give_up_renting(attempt, now=now, why=f"offer search failed: {exc}")
    rates = preemption_rates(job.team_id, now=now)
    speeds = speed_book(job, offers, history)
    images = image_cache.image_cached_odds(job.team_id, job.image)
    decision = selection.choose_offer(offers, req, profile, speeds, rates=rates, images=images)
    if decision is None:
        return give_up_renting(attempt, now=now, why="no offer matches the requirements")
    onstart = render_bootstrap(attempt, token=token)
    image_login = job_secrets.image_login_for(job)  # the only secret in a create request
    refused: list[str] = []
    for candidate in decision.candidates[:MAX_CREATE_TRIES]:
        offer, rental = candidate.offer, candidate.rental
        bid = rental.gpu_usd_per_hour if rental.rental.kind == selection.INTERRUPTIBLE else None
        note_create_sent(attempt, offer, rental, disk_gb=req.disk_gb, now=now)
        try:
            created = client.create_instance(
                offer.id,
                image=job.image,
                disk_gb=req.disk_gb,
                label=attempt.label,
                onstart=onstart,
                bid_usd_per_hour=bid,
                image_login=image_login,
            )
        except OfferGone:
            continue  # someone else rented it between search and create: next offer
        except OfferRefused as exc:
            refused.append(note_refused_offer(attempt, offer, exc, now=now))
            continue  # about this offer only, not the account: the next one may rent
        except InsufficientCredit as exc:
            # Every offer would say the same: stop here, and say who can fix it.
            why = (
                f"Vast refused to rent for billing reasons ({exc}): a team admin must add credit "
                "to the Vast account; renting tries again on its own after the backoff"
            )
            return give_up_renting(attempt, now=now, why=why, end_reason="no_credit")
        except CreateOutcomeUnknown:
            logger.warning("create for %s has an unknown outcome; adopting by label", attempt)
            return "unknown"
        except VastError as exc:
            return give_up_renting(attempt, now=now, why=f"create failed: {exc}")
        if created.created_stopped:
            refused.append(destroy_created_stopped(attempt, created.id, offer, client=client))
            continue
        try:
            lifecycle.mark_rented(
                attempt.pk,
                fields={**offer_fields(offer), **rental_fields(rental), "disk_gb": req.disk_gb},
                instance_id=created.id,
                decision=decision.as_dict(),
                now=now,
            )
        except Exception:
            logger.exception(
                "instance %s for %s was created but not recorded; adopting by label",
                created.id,
                attempt,
            )
            return "unknown"
        return "rented"
    why = "every chosen offer was taken before we could rent it"
    if refused:
        why = f"no chosen offer would run: {'; '.join(refused)}"
    return give_up_renting(attempt, now=now, why=why)


def note_refused_offer(attempt: Attempt, offer: Offer, exc: OfferRefused, *, now: datetime) -> str:
    """Say on ATTEMPT's job that Vast refused OFFER (its id and Vast's words) and return the
    same sentence for the attempt's closing reason, should every offer refuse."""
    offer_id = exc.offer_id or offer.id
    why = f"Vast refused offer {offer_id} ({exc.status}): {exc.message}"
    logger.warning("%s: %s; trying the next offer", attempt, why)
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="offer_refused",
        message=why,
        offer_id=offer_id,
        status=exc.status,
        vast_message=exc.message[:300],
    )
    return why


def destroy_created_stopped(attempt: Attempt, instance_id: int, offer, *, client) -> str:
    """Destroy a contract Vast created stopped (``success: false`` with ``new_contract``: a bid
    under the host's ``min_bid``), at once: it bills storage and would never train. Returns why,
    for the event that closes the attempt."""
    why = f"instance {instance_id} on offer {offer.id} was created stopped (bid under min_bid)"
    logger.warning("%s: %s; destroying it", attempt, why)
    try:
        client.destroy_instance(instance_id)
    except VastError as exc:  # the orphan reaper destroys it by its label later
        logger.warning("destroying stopped instance %s failed: %s", instance_id, exc)
    return why


def note_create_sent(
    attempt: Attempt, offer: Offer, rental: selection.RentalCost, *, disk_gb: float, now: datetime
) -> None:
    """Commit, before the create is sent, that one is and what it rents: if this worker dies
    now, the claim is settled by adopting the instance at these rates, or, had nothing been
    sent, by planning again at once (``rent_claims``)."""
    Attempt.objects.filter(pk=attempt.pk, state=AttemptState.REQUESTED).update(
        create_sent_at=now, **{**offer_fields(offer), **rental_fields(rental)}, disk_gb=disk_gb
    )


def settle_if_claimer_died(
    attempt_id: int, *, now: datetime, client: VastClient | None = None
) -> str:
    """A rent message found its attempt already claimed: settle the claim if the process that
    made it is dead (``rent_claims.claim_is_dead``), else leave it. Says what happened."""
    attempt = Attempt.objects.select_related("job__team").filter(pk=attempt_id).first()
    if attempt is None or attempt.state != AttemptState.REQUESTED:
        return "not-planned"
    if not rent_claims.claim_is_dead(attempt, now=now):
        return "not-planned"  # a duplicate message: its twin is still renting
    instance = None
    if attempt.create_sent_at is not None:
        own_client = client is None
        client = client or VastClient.from_settings(attempt.job.team)
        try:
            found = client.list_instances(label=attempt.label)
        finally:
            if own_client:
                client.close()
        instance = found[0] if found else None
    return settle_dead_claim(attempt, instance, now=now)


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


def offer_fields(offer: Offer) -> dict:
    return {
        "offer_id": offer.id,
        "machine_id": offer.machine_id,
        "gpu_name": offer.gpu_name,
        "dph_base": offer.dph_base or 0.0,
        "storage_usd_per_gb_hour": offer.storage_usd_per_gb_hour or 0.0,
        "download_usd_per_gb": offer.download_usd_per_gb or 0.0,
        "upload_usd_per_gb": offer.upload_usd_per_gb or 0.0,
    }


def rental_fields(cost: selection.RentalCost) -> dict:
    """How the attempt was rented: the GPU price paid (the bid, for an interruptible one)."""
    interruptible = cost.rental.kind == selection.INTERRUPTIBLE
    return {
        "dph_base": cost.gpu_usd_per_hour,
        "rental": cost.rental.kind,
        "bid_margin": cost.rental.bid_margin if interruptible else None,
    }


# Interruptions a planned move or a cancel ends are not the host's doing: they do not count.
NOT_PREEMPTIONS = ("contract_expiring", "cancelled", "budget")
RATE_HISTORY_DAYS = 90


def preemption_rates(team_id: int, *, now: datetime) -> selection.PreemptionRates:
    """The team's interruptions per rented hour over the last ``RATE_HISTORY_DAYS``, by rental
    type, GPU model and bid margin (``selection.margin_bucket``): what ``expected_cost`` prices
    a rental's interruptions with, before the prior's share."""
    since = now - timedelta(days=RATE_HISTORY_DAYS)
    rented = (
        Attempt.objects.filter(job__team_id=team_id, rented_at__gte=since)
        .exclude(end_reason__in=NOT_PREEMPTIONS)
        .annotate(lost=Count("interruption") + F("outbids"))
        .values_list("rental", "gpu_name", "bid_margin", "rented_at", "ended_at", "lost")
    )
    seen: dict[tuple[str, str, float], list[float]] = {}
    for kind, gpu, margin, start, end, lost in rented:
        key = (kind, gpu, selection.margin_bucket(margin or 0.0) if margin is not None else 0.0)
        counts = seen.setdefault(key, [0, 0.0])
        counts[0] += lost
        counts[1] += max(((end or now) - start).total_seconds(), 0.0) / 3600
    return selection.PreemptionRates({k: (int(n), h) for k, (n, h) in seen.items()})


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
        Attempt.objects.filter(
            pk=attempt.pk, state__in=[AttemptState.PLANNED, AttemptState.REQUESTED]
        ).update(state=AttemptState.ENDED, end_reason=end_reason, ended_at=now)
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
