"""Which attempt a charge belongs to (its instance id and time: its own instance, or one of the
racers of its hedged rent). What NomadGPU recorded is never changed by a charge
(``billing.spend``): the job's cost shows the charges themselves (``billing.cost``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta

from billing.models import Charge
from jobs.models import Attempt, Racer

logger = logging.getLogger(__name__)

# A charge belongs to an attempt whose rental it overlaps; this much slack absorbs clock
# skew between Vast's usage records and ours.
MATCH_SLACK = timedelta(hours=1)


def charge_days(charge: Charge) -> tuple[datetime, datetime]:
    """The UTC days CHARGE covers, from the midnight of its first to the midnight after its last.

    Vast keys charge rows by day at 00:00 UTC: ``start`` and ``end`` are day keys (both the same
    midnight for one day's row), not the first and last second of use, so the usage may lie
    anywhere in those days."""
    first = (charge.start or datetime.combine(charge.day, time.min, tzinfo=UTC)).astimezone(UTC)
    last = (charge.end or first).astimezone(UTC)
    return (
        datetime.combine(first.date(), time.min, tzinfo=UTC),
        datetime.combine(last.date() + timedelta(days=1), time.min, tzinfo=UTC),
    )


def overlaps(charge: Charge, attempt, *, now: datetime) -> bool:
    """Whether ATTEMPT's rental (with ``MATCH_SLACK``) touches a day CHARGE covers: a charge
    belongs to the attempt holding its contract id on that day."""
    if attempt.rented_at is None:
        return False
    begin = attempt.rented_at - MATCH_SLACK
    end = (attempt.ended_at or now) + MATCH_SLACK
    lo, hi = charge_days(charge)
    return lo < end and hi > begin


def match_charges(team, *, now: datetime) -> int:
    """Link TEAM's unmatched charges to attempts by instance id (``source`` "instance-<id>")
    and time; returns how many were linked. Charges that stay unmatched are orphans or
    rentals made outside NomadGPU."""
    pending = Charge.objects.filter(team=team, attempt__isnull=True, instance_id__isnull=False)
    wanted = pending.values("instance_id")
    # A hedged rent's losers are billed by Vast like any instance: their charges are the
    # attempt's that raced them (billing.spend counts them there).
    attempts = {
        r.instance_id: r.attempt
        for r in Racer.objects.filter(
            attempt__job__team=team, instance_id__in=wanted
        ).select_related("attempt")
    }
    attempts.update(
        (a.instance_id, a) for a in Attempt.objects.filter(job__team=team, instance_id__in=wanted)
    )
    linked = 0
    for charge in pending:
        attempt = attempts.get(charge.instance_id)
        try:
            if attempt is not None and overlaps(charge, attempt, now=now):
                linked += Charge.objects.filter(pk=charge.pk, attempt__isnull=True).update(
                    attempt=attempt
                )
        except (TypeError, ValueError):  # one odd row stays unmatched; the others go on
            logger.exception("matching charge %s to attempt %s failed", charge.pk, attempt)
    return linked
