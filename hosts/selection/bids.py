"""How to rent an offer: on demand or a bid (which margins to weigh, what a bid costs), and
what to do after an outbid (raise the bid and wait for the machine, or move)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hosts.selection.costs import SECONDS_PER_HOUR
from hosts.selection.requirements import Requirements
from hosts.vast import Offer
from hosts.vast.parsing import BID_MAX_USD, BID_MIN_USD, CHANGE_BID_MAX_USD

ON_DEMAND, INTERRUPTIBLE, AUTO = "on-demand", "interruptible", "auto"
RENTALS = (ON_DEMAND, INTERRUPTIBLE, AUTO)
# The margins over min_bid the model weighs (a bid is min_bid x (1 + margin)).
BID_MARGINS = (0.0, 0.05, 0.15, 0.3, 0.5, 1.0)


@dataclass(frozen=True)
class Rental:
    """On-demand at ``dph_base``, or interruptible: a bid of ``min_bid`` x (1 + BID_MARGIN)."""

    kind: str = ON_DEMAND
    bid_margin: float = 0.0

    def gpu_usd_per_hour(self, offer: Offer) -> float | None:
        """What the GPU costs per hour rented this way; None when the offer takes no bid."""
        if self.kind == ON_DEMAND:
            return offer.dph_base
        if not offer.min_bid or offer.min_bid <= 0:
            return None
        return round(max(offer.min_bid * (1 + self.bid_margin), BID_MIN_USD), 4)

    @property
    def label(self) -> str:
        """ "on-demand" or "interruptible, min_bid +15 %"."""
        if self.kind == ON_DEMAND:
            return ON_DEMAND
        return f"interruptible, min_bid +{self.bid_margin:.0%}"


def rentals_to_weigh(offer: Offer, req: Requirements) -> list[Rental]:
    """The ways REQ allows OFFER to be rented: on-demand, and bids at each margin that stay
    under ``max_bid_dph`` and Vast's range (and, for ``auto``, under the on-demand price)."""
    found = [] if req.rental == INTERRUPTIBLE else [Rental(ON_DEMAND)]
    if req.rental == ON_DEMAND or not offer.min_bid:
        return found
    cap = min(req.max_bid_dph or BID_MAX_USD, BID_MAX_USD)
    for margin in req.bid_margins or BID_MARGINS:
        price = Rental(INTERRUPTIBLE, margin).gpu_usd_per_hour(offer)
        if price is None or price > cap:
            continue
        if req.rental == AUTO and offer.dph_base is not None and price >= offer.dph_base:
            continue  # paying on-demand's price for an interruptible machine never pays
        found.append(Rental(INTERRUPTIBLE, margin))
    return found


@dataclass(frozen=True)
class OutbidChoice:
    """After an outbid: raise the bid and wait for the same machine (RAISE_TO), or move."""

    raise_to: float | None
    stay_usd: float
    move_usd: float

    @property
    def why(self) -> str:
        """One line for the job's timeline."""
        # Staying restarts the same instance, whose disk Vast keeps: the one place where the
        # model is on disk (a new instance's disk starts empty; ``ImageCache``).
        verb = (
            f"raise the bid to ${self.raise_to:.4f}/h (the same instance: image cached, "
            "model on disk)"
            if self.raise_to
            else "move"
        )
        return f"{verb}: staying ${self.stay_usd:.3f} vs moving ${self.move_usd:.3f} expected"


# A raise bids this much over the new floor: a bid equal to the winning one is not assumed to
# take the machine back (Vast documents no tie rule).
RAISE_STEP_USD = 0.001


def outbid_choice(
    *,
    steps_left: int,
    stay_seconds_per_step: float,
    new_min_bid: float | None,
    bid_margin: float,
    stay_outbids_per_h: float,
    restart_h: float,
    cap_usd_per_hour: float | None,
    move_usd_per_hour: float,
    move_seconds_per_step: float,
    move_interruptions_per_h: float,
    move_rework_usd: float,
) -> OutbidChoice:
    """Whether an outbid job should raise its bid and wait for its machine, or move.

    Both are priced from the newest checkpoint (STEPS_LEFT; the work lost is the same either
    way). Staying pays the new bid (NEW_MIN_BID plus the job's margin and ``RAISE_STEP_USD``)
    for the steps left at this machine's speed and a restart in the same container
    (RESTART_H: the image and model are on its disk already), plus the restarts its
    STAY_OUTBIDS_PER_H still expect. Moving pays the best other candidate's price at its own
    speed, a whole start-up (MOVE_REWORK_USD) and the rework of its own expected
    interruptions. A bid at or over CAP_USD_PER_HOUR (the job's max bid, and the machine's
    on-demand price: paying that for an interruptible machine never pays) or out of Vast's
    range is never placed.
    """
    move_h = steps_left * move_seconds_per_step / SECONDS_PER_HOUR
    move = move_usd_per_hour * move_h + move_rework_usd * (1 + move_interruptions_per_h * move_h)
    if not new_min_bid or new_min_bid <= 0:
        return OutbidChoice(None, math.inf, move)
    price = round(max(new_min_bid * (1 + bid_margin), BID_MIN_USD) + RAISE_STEP_USD, 4)
    stay_h = steps_left * stay_seconds_per_step / SECONDS_PER_HOUR
    restarts = 1 + stay_outbids_per_h * stay_h
    stay = price * (stay_h + restarts * restart_h)
    cap = min(cap_usd_per_hour or CHANGE_BID_MAX_USD, CHANGE_BID_MAX_USD)
    if price >= cap or stay >= move:
        return OutbidChoice(None, stay, move)
    return OutbidChoice(price, stay, move)
