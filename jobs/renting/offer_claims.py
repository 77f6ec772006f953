"""One offer is never bought twice: every create is preceded by a claim of its offer
(``OfferClaim``), taken in a transaction of its own, and refused while another rent holds it.

Vast's own answer is no guard: two parallel buyers took the same offer and Vast accepted both
(skypilot#9117). Without a claim, two jobs planned in the same pass, or two racers of one hedged
rent, could both create on the one offer their rankings put first, and pay two instances on one
machine. A claim is held while its holder lives (a racer in its race, or the attempt, for as
long as it rents that offer's instance); a claim whose holder ended is stale, and is released
by the next claim of its offer (``OfferClaimQuerySet.release_stale``), so one that an ended
holder's path forgot never blocks an offer.
"""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from jobs.models import Attempt, OfferClaim, Racer


def claim_offer(
    offer_id: int, *, attempt: Attempt, now: datetime, racer: Racer | None = None
) -> bool:
    """Claim OFFER_ID for ATTEMPT (and RACER) before its create is sent; False when another
    rent holds it (its create may be under way: this rent must not send one). Joins the
    caller's transaction when there is one (a racer's row, claim and budget hold commit
    together); commits on its own otherwise."""
    with transaction.atomic():
        OfferClaim.objects.release_stale(offer_id, now=now)
        try:
            with transaction.atomic():
                OfferClaim.objects.create(
                    offer_id=offer_id, attempt=attempt, racer=racer, claimed_at=now
                )
        except IntegrityError:
            return False
    return True


def release_offer(offer_id: int, *, attempt: Attempt, now: datetime) -> int:
    """ATTEMPT will not rent OFFER_ID after all (gone, refused, created stopped): release it."""
    return OfferClaim.objects.release(offer_id=offer_id, attempt_id=attempt.pk, now=now)


def held_by_others(offer_id: int, *, attempt: Attempt) -> bool:
    """Whether another rent holds OFFER_ID now (for the words of a skipped offer)."""
    return OfferClaim.objects.held().filter(offer_id=offer_id).exclude(attempt=attempt).exists()
