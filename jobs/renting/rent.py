"""Renting a host for a job, exactly once.

1. ``lifecycle.plan_rent`` commits an ``Attempt`` row (PLANNED) before any provider call. A
   partial unique index allows one live attempt per job, so two workers cannot both plan one.
2. ``rent`` (this module, the ``rent_attempt`` task) claims PLANNED → REQUESTED (with the agent
   token's digest) and commits, then asks ``hosts`` to choose an offer and creates the instance
   labelled ``ngpu:<env>:<job>:<n>``. A create whose outcome is unknown is never repeated: the
   watchdog adopts the instance by its label, or closes the attempt after a grace period.
3. ``lifecycle.mark_rented`` stores the instance on the attempt and moves the job to
   ``starting``.

What happens to a rent afterwards (adopted by its label, a dead claim settled, given up with
a backoff) is ``settle``.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery.exceptions import SoftTimeLimitExceeded

from hosts import selection
from hosts.models import MachineRental
from hosts.vast import (
    CreateOutcomeUnknown,
    InsufficientCredit,
    Offer,
    OfferGone,
    OfferRefused,
    VastClient,
    VastError,
)
from jobs import attention, lifecycle
from jobs.bootstrap import render_bootstrap
from jobs.code import job_secrets
from jobs.models import Attempt, AttemptState, Job
from jobs.renting import claims, image_cache, market, measures, shape_history
from jobs.renting.interruption_rates import preemption_rates
from jobs.renting.settle import give_up_renting, settle_dead_claim
from jobs.renting.terms import profile_for, requirements_for
from jobs.stored_spec import StoredSpecInvalid
from nomadgpu.tokens import issue_token

logger = logging.getLogger(__name__)


MAX_CREATE_TRIES = 5


def speed_book(
    job: Job, offers: list[Offer], history: measures.History | None = None
) -> selection.SpeedBook:
    """Seconds per step this job and the team's earlier runs of its shape showed on machines
    and GPU models (``shape_history.measured_speeds``: medians of the newest), and DLPerf for the
    rest, from those runs' offers and the market's."""
    history = history if history is not None else shape_history.history_for(job)
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
        rent_claimed_by=claims.this_process(),
        token_prefix=token.prefix,
        token_digest=token.digest,
    )
    if not claimed:
        # A duplicate message, the job cancelled meanwhile, or this message again after the
        # worker that claimed it died (``reject_on_worker_lost``): that claim is settled now.
        return settle_if_claimer_died(attempt_id, now=now, client=client)
    attempt = Attempt.objects.select_related("job__team").get(pk=attempt_id)
    try:
        with market.team_client(attempt.job.team, client=client) as vast:
            return _choose_and_create(attempt, token.token, client=vast, now=now)
    except StoredSpecInvalid:
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


def _choose_and_create(attempt: Attempt, token: str, *, client: VastClient, now: datetime) -> str:
    job = attempt.job
    history = shape_history.history_for(job)
    req, profile = requirements_for(job), profile_for(job, history)
    try:
        offers = market.search_offers(client, req)
    except VastError as exc:
        return give_up_renting(attempt, now=now, why=f"offer search failed: {exc}")
    rates = preemption_rates(job.team_id, now=now)
    speeds = speed_book(job, offers, history)
    images = image_cache.image_cached_odds(job.team_id, job.image)
    memory = MachineRental.objects.memory(now=now, machine_ids=market.machine_ids(offers))
    decision = selection.choose_offer(
        offers, req, profile, speeds, rates=rates, images=images, memory=memory
    )
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
    made it is dead (``jobs.renting.claims.claim_is_dead``), else leave it. Says what happened."""
    attempt = Attempt.objects.select_related("job__team").filter(pk=attempt_id).first()
    if attempt is None or attempt.state != AttemptState.REQUESTED:
        return "not-planned"
    if not claims.claim_is_dead(attempt, now=now):
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
