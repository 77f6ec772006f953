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
from jobs.renting import (
    claims,
    image_cache,
    market,
    measures,
    offer_claims,
    race,
    race_end,
    race_start,
    shape_history,
)
from jobs.renting.creates import (
    destroy_created_stopped,
    note_refused_offer,
    offer_fields,
    rental_fields,
)
from jobs.renting.interruption_rates import preemption_rates
from jobs.renting.settle import adopted_fields, give_up_renting, settle_dead_claim
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
    plan, entries = race.plan_for(job, decision, now=now)
    if plan.k > 1:  # a hedged rent (jobs.renting.race); None: its budget allows one host only
        raced = race_start.start_race(attempt, decision, plan, entries, client=client, now=now)
        if raced is not None:
            return raced
    record = race.decision_record(decision, plan)
    return _rent_one(attempt, decision, record, token, client=client, now=now)


def _rent_one(
    attempt: Attempt,
    decision: selection.Decision,
    record: dict,
    token: str,
    *,
    client: VastClient,
    now: datetime,
) -> str:
    """Create one instance for ATTEMPT: the decision's candidates in rank order, each claimed
    before its create (``offer_claims``), until one rents. Says what happened."""
    job, req = attempt.job, decision.requirements
    onstart = render_bootstrap(attempt, token=token)
    image_login = job_secrets.image_login_for(job)  # the only secret in a create request
    refused: list[str] = []
    for candidate in decision.candidates[:MAX_CREATE_TRIES]:
        offer, rental = candidate.offer, candidate.rental
        if not offer_claims.claim_offer(offer.id, attempt=attempt, now=now):
            continue  # another rent holds it, its create maybe under way (skypilot#9117)
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
            offer_claims.release_offer(offer.id, attempt=attempt, now=now)
            continue  # someone else rented it between search and create: next offer
        except OfferRefused as exc:
            offer_claims.release_offer(offer.id, attempt=attempt, now=now)
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
            # Never created again blindly (skypilot#10171): looked for by its label first.
            logger.warning("create for %s has an unknown outcome; looking for its label", attempt)
            return _adopt_by_label(attempt, client=client, record=record, req=req, now=now)
        except VastError as exc:
            return give_up_renting(attempt, now=now, why=f"create failed: {exc}")
        if created.created_stopped:
            offer_claims.release_offer(offer.id, attempt=attempt, now=now)
            refused.append(destroy_created_stopped(attempt, created.id, offer, client=client))
            continue
        return _record_rented(attempt, created.id, offer, rental, record=record, req=req, now=now)
    why = "every chosen offer was taken before we could rent it"
    if refused:
        why = f"no chosen offer would run: {'; '.join(refused)}"
    return give_up_renting(attempt, now=now, why=why)


def _record_rented(
    attempt: Attempt,
    instance_id: int,
    offer: Offer,
    rental: selection.RentalCost,
    *,
    record: dict,
    req: selection.Requirements,
    now: datetime,
) -> str:
    try:
        lifecycle.mark_rented(
            attempt.pk,
            fields={**offer_fields(offer), **rental_fields(rental), "disk_gb": req.disk_gb},
            instance_id=instance_id,
            decision=record,
            now=now,
        )
    except Exception:
        logger.exception(
            "instance %s for %s was created but not recorded; adopting by label",
            instance_id,
            attempt,
        )
        return "unknown"
    return "rented"


def _adopt_by_label(
    attempt: Attempt,
    *,
    client: VastClient,
    record: dict,
    req: selection.Requirements,
    now: datetime,
) -> str:
    """A create whose answer was lost: the instance it may have made, found by the attempt's
    label at once, is the attempt's (at the offer recorded when it was sent); none listed, the
    attempt stays requested and the watchdog adopts it later or gives up after grace."""
    try:
        found = client.list_instances(label=attempt.label)
    except VastError as exc:
        logger.warning("listing %s by its label failed: %s", attempt, exc)
        return "unknown"
    if not found:
        return "unknown"
    sent = Attempt.objects.get(pk=attempt.pk)
    fields = {**adopted_fields(sent, found[0]), "disk_gb": req.disk_gb}
    lifecycle.mark_rented(
        attempt.pk, fields=fields, instance_id=found[0].id, decision=record, now=now
    )
    return "rented"


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
    if attempt.raced:  # a hedged rent: its racers' creates, by their labels
        with market.team_client(attempt.job.team, client=client) as vast:
            listed = {i.label: i for i in vast.list_instances() if i.label}
        return race_end.settle_requested_race(attempt, listed, now=now, claimer_dead=True)
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
