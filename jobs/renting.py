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
    VastClient,
    VastError,
)
from jobs import lifecycle
from jobs.bootstrap import render_bootstrap
from jobs.models import Attempt, AttemptState, Checkpoint, Job, JobEvent
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


def requirements_for(job: Job) -> selection.Requirements:
    data = dict(job.requirements)
    if "gpu_names" in data:
        data["gpu_names"] = tuple(data["gpu_names"])
    data["avoid_machine_ids"] = frozenset(job.avoid_machine_ids)
    return selection.Requirements(**data)


# Used when a job does not say: a typical PyTorch image, nothing else to download.
PROFILE_DEFAULTS = {"image_gb": 5.0, "model_gb": 0.0, "upload_gb": 1.0}


def profile_for(job: Job) -> selection.JobProfile:
    resume_step = Checkpoint.objects.filter(job=job).newest_ready_step() or 0
    data = {**PROFILE_DEFAULTS, "steps_total": job.total_steps or 0, **job.profile}
    return selection.JobProfile(**{**data, "steps_done": resume_step})


def speed_book(job: Job, offers: list[Offer]) -> selection.SpeedBook:
    """Seconds per step this job showed on machines and GPU models it ran on before."""
    seen = job.attempts.exclude(seconds_per_step=None).values_list(
        "machine_id", "gpu_name", "seconds_per_step"
    )
    by_machine = {m: s for m, _, s in seen if m is not None}
    by_model = {g: s for _, g, s in seen if g}
    book = selection.SpeedBook(by_machine=by_machine, by_model=by_model)
    return book.with_market(offers, job.requirements.get("num_gpus", 1))


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
        token_prefix=token.prefix,
        token_digest=token.digest,
    )
    if not claimed:
        return "not-planned"  # a duplicate message, or the job was cancelled meanwhile
    attempt = Attempt.objects.select_related("job__team").get(pk=attempt_id)
    own_client = client is None
    try:
        client = client or VastClient.from_settings(attempt.job.team)
        return _choose_and_create(attempt, token.token, client=client, now=now)
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
    req, profile = requirements_for(job), profile_for(job)
    try:
        offers = client.search_offers(
            selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
        )
    except VastError as exc:
        return give_up_renting(attempt, now=now, why=f"offer search failed: {exc}")
    rates = preemption_rates(job.team_id, now=now)
    decision = selection.choose_offer(offers, req, profile, speed_book(job, offers), rates=rates)
    if decision is None:
        return give_up_renting(attempt, now=now, why="no offer matches the requirements")
    onstart = render_bootstrap(attempt, token=token)
    refused: list[str] = []
    for candidate in decision.candidates[:MAX_CREATE_TRIES]:
        offer, rental = candidate.offer, candidate.rental
        bid = rental.gpu_usd_per_hour if rental.rental.kind == selection.INTERRUPTIBLE else None
        try:
            created = client.create_instance(
                offer.id,
                image=job.image,
                disk_gb=req.disk_gb,
                label=attempt.label,
                onstart=onstart,
                bid_usd_per_hour=bid,
            )
        except OfferGone:
            continue  # someone else rented it between search and create: next offer
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
    spend and reconciliation need them as much as for a rent that completed normally."""
    return {
        "machine_id": instance.machine_id,
        "gpu_name": instance.gpu_name or "",
        "dph_base": instance.dph_base or 0.0,
        "storage_usd_per_gb_hour": instance.storage_usd_per_gb_hour or 0.0,
        "download_usd_per_gb": instance.download_usd_per_gb or 0.0,
        "upload_usd_per_gb": instance.upload_usd_per_gb or 0.0,
        "disk_gb": instance.disk_space_gb or 0.0,
        "rental": selection.INTERRUPTIBLE if instance.is_bid else selection.ON_DEMAND,
    }


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
