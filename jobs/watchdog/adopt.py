"""Creates whose outcome is unknown: adopted by label, settled, or given up.

A claim whose renting process died before a create was sent cannot have made an instance, so
it is settled at once, without a provider call (``jobs.renting.claims``). One whose create was
sent waits for the provider poll, which adopts the labelled instance, or gives up after
``REQUESTED_GRACE_S``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from hosts.vast import Instance
from jobs import attention
from jobs.models import Attempt, AttemptState
from jobs.renting import claims, settle


def settle_unsent_claims(now: datetime) -> int:
    """Claims of rents whose process died before a create was sent: nothing can exist at Vast,
    so each is settled at once, without a provider call, and its job is planned again in this
    same pass (``rent_claims``). Claims with a create sent wait for the provider poll, which
    adopts by label. Says how many were settled."""
    claimed = Attempt.objects.filter(state=AttemptState.REQUESTED, create_sent_at=None).order_by()
    settled = 0
    for attempt in claimed:
        if claims.claim_is_dead(attempt, now=now):
            what = "settle the rent its dead worker left"
            with attention.row(job_id=attempt.job_id, what=what, now=now):
                settled += settle.settle_dead_claim(attempt, None, now=now) == "settled"
    return settled


def adopt_or_close(attempt: Attempt, instance: Instance | None, now: datetime) -> None:
    """A create whose outcome was unknown: adopt the labelled instance, or give up after grace.
    A claim whose renting process died is settled at once (``rent_claims``)."""
    if claims.claim_is_dead(attempt, now=now):
        settle.settle_dead_claim(attempt, instance, now=now)
        return
    requested = attempt.requested_at or attempt.created_at
    if now - requested < timedelta(seconds=settings.ADOPT_AFTER_S):
        return  # the renting worker may still be waiting for the create call
    if instance is not None:
        settle.adopt(attempt, instance, now=now)
    elif now - requested >= timedelta(seconds=settings.REQUESTED_GRACE_S):
        settle.give_up_renting(attempt, now=now, why="instance creation never completed")
