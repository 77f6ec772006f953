"""How often a rental is interrupted: λ per rented hour, by rental type, GPU model and bid
margin, from the team's own history blended with a prior (``PreemptionRates``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hosts.selection.bids import BID_MARGINS, INTERRUPTIBLE

# The prior, until the team's own history says otherwise (``PreemptionRates``). A host is lost
# (offline, vanished, rebooted for good) about once in 50 rented hours: the field report's
# community hosts at reliability ~0.98-0.99. A bid at min_bid is outbid about every two hours
# on a popular GPU (Vast has no notice and no minimum run; the FAQ's "50-80 % cheaper" is paid
# for with that), and each margin of 0.25 over min_bid cuts the rate by e.
PRIOR_HOST_LOSS_PER_H = 0.02
PRIOR_OUTBID_PER_H = 0.5
PRIOR_OUTBID_MARGIN_SCALE = 0.25
# How many rented hours the prior weighs against what was observed.
PRIOR_WEIGHT_H = 10.0


def prior_rate(kind: str, margin: float = 0.0) -> float:
    """Interruptions per rented hour before any history: host loss, plus outbids for a bid."""
    if kind != INTERRUPTIBLE:
        return PRIOR_HOST_LOSS_PER_H
    return PRIOR_HOST_LOSS_PER_H + PRIOR_OUTBID_PER_H * math.exp(
        -margin / PRIOR_OUTBID_MARGIN_SCALE
    )


def margin_bucket(margin: float) -> float:
    """The ``BID_MARGINS`` entry nearest MARGIN (history is counted by these)."""
    return min(BID_MARGINS, key=lambda m: abs(m - margin))


def history_words(seen: int, hours: float) -> str:
    """Where a blended λ came from, as the job page says it: "the team's 1 interruption in
    36 min rented, weighed with a 10 h prior". Under an hour reads in minutes (a tenth of an
    hour rounded to "0.0 h" read as if nothing was rented)."""
    minutes = hours * 60
    rented = (
        f"{hours:.1f} h"
        if hours >= 1
        else f"{round(minutes)} min"
        if minutes >= 1
        else "under a minute"
    )
    what = "interruption" if seen == 1 else "interruptions"
    return f"the team's {seen} {what} in {rented} rented, weighed with a {PRIOR_WEIGHT_H:g} h prior"


@dataclass(frozen=True)
class PreemptionRates:
    """Interruptions and rented hours seen, by (rental type, GPU model, margin bucket); what is
    not seen falls back to ``prior_rate``, and what is seen is blended with it (the prior as
    ``PRIOR_WEIGHT_H`` hours at its own rate)."""

    observed: Mapping[tuple[str, str, float], tuple[int, float]] = field(default_factory=dict)

    def rate(self, kind: str, gpu_name: str, margin: float = 0.0) -> tuple[float, str]:
        """(λ per hour, where it came from) for a rental of KIND on GPU_NAME at MARGIN."""
        bucket = margin_bucket(margin) if kind == INTERRUPTIBLE else 0.0
        prior = prior_rate(kind, margin)
        seen, hours = self.observed.get((kind, gpu_name, bucket), (0, 0.0))
        if hours <= 0:
            return prior, "prior"
        blended = (seen + prior * PRIOR_WEIGHT_H) / (hours + PRIOR_WEIGHT_H)
        return blended, history_words(seen, hours)
