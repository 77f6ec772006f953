"""The team's interruption rates: how often its rentals were lost per rented hour, by rental
kind, GPU model and bid margin, over the last ``RATE_HISTORY_DAYS``; what the selection prices
interruptions with (``selection.PreemptionRates``). Planned moves, cancels and budget pauses
are not interruptions, and neither is a fire drill (``Interruption.drill``): the host was
destroyed on purpose, and its rented hours count as hours without a loss.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, F, Q

from hosts import selection
from jobs.models import Attempt

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
        .annotate(lost=Count("interruption", filter=Q(interruption__drill=False)) + F("outbids"))
        .values_list("rental", "gpu_name", "bid_margin", "rented_at", "ended_at", "lost")
    )
    seen: dict[tuple[str, str, float], list[float]] = {}
    for kind, gpu, margin, start, end, lost in rented:
        key = (kind, gpu, selection.margin_bucket(margin or 0.0) if margin is not None else 0.0)
        counts = seen.setdefault(key, [0, 0.0])
        counts[0] += lost
        counts[1] += max(((end or now) - start).total_seconds(), 0.0) / 3600
    return selection.PreemptionRates({k: (int(n), h) for k, (n, h) in seen.items()})
