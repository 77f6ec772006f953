"""Which attempt a charge belongs to (its instance id and time: its own instance, or one of the
racers of its hedged rent), and the billed traffic each matched attempt then carries for spend
and the budgets."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta

from django.db.models import Sum

from billing.cost import covered_until
from billing.models import Charge, ChargeItem
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


def note_billed_traffic(team, *, now: datetime) -> int:
    """Copy the traffic billed to each of TEAM's matched attempts onto it, with the moment the
    import covers, so spend (and the budgets) count the invoice without reading charges.
    Returns how many attempts changed."""
    covered = covered_until(team) or now
    billed: dict[int, dict[str, float]] = {
        a: {"billed_download_usd": 0.0, "billed_upload_usd": 0.0}
        for a in Charge.objects.filter(team=team, attempt__isnull=False).values_list(
            "attempt_id", flat=True
        )
    }
    sums = (
        ChargeItem.objects.filter(charge__team=team, charge__attempt__isnull=False)
        .filter(type__in=("bwd", "bwu"))
        .values_list("charge__attempt_id", "type")
        .annotate(total=Sum("amount"))
    )
    for attempt_id, kind, total in sums:
        field = "billed_download_usd" if kind == "bwd" else "billed_upload_usd"
        billed[attempt_id][field] = float(total)
    changed = 0
    for attempt_id, amounts in billed.items():
        changed += (
            Attempt.objects.filter(pk=attempt_id)
            .exclude(billed_through=covered, **amounts)
            .update(billed_through=covered, **amounts)
        )
    return changed
