"""One create of one offer, for a plain rent and a hedged rent's racers alike: what it rents,
copied from the offer onto the attempt or racer (``offer_fields``, ``rental_fields``), and what
is done and said when it does not rent (``note_refused_offer``, ``destroy_created_stopped``).
"""

from __future__ import annotations

import logging
from datetime import datetime

from hosts import selection
from hosts.vast import Offer, OfferRefused, VastError
from jobs import lifecycle
from jobs.models import Attempt

logger = logging.getLogger(__name__)


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


def destroy_created_stopped(attempt: Attempt, instance_id: int, offer: Offer, *, client) -> str:
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
    """What an attempt or racer rents through OFFER, copied at its create."""
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
    """How an attempt or racer was rented: the GPU price paid (the bid, for an interruptible
    one)."""
    interruptible = cost.rental.kind == selection.INTERRUPTIBLE
    return {
        "dph_base": cost.gpu_usd_per_hour,
        "rental": cost.rental.kind,
        "bid_margin": cost.rental.bid_margin if interruptible else None,
    }
