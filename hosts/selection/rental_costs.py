"""The expected total of one way of renting one offer, interruptions priced in, and the cheapest
way (``expected_cost``, ``best_rental``).

Preemption (``expected_cost``): a rental is on-demand or interruptible, a bid of ``min_bid`` x
(1 + margin). Each is charged its expected rework: λ (interruptions per rented hour, for that
rental type, GPU model and bid margin: ``PreemptionRates``, the team's own history blended with
a documented prior) x the expected hours gives the expected interruptions, and each costs the
detection, a new rent, a start-up again (image, model and checkpoint downloads at the offer's
bandwidth) and half a checkpoint interval of training done again. ``rental: auto`` takes the
cheaper expected total; the bid margin is chosen the same way (a higher bid, fewer
preemptions).

The team's memory of machines (``machine_memory``; given, or None: not priced) adds what the
machine itself showed: the link it really delivered and its speed against its promise, its own
losses per rented hour in place of its GPU model's host losses, and P(fail to start) x what a
failed start costs (``failed_start``), the time lost valued at the job's GPU $/h.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from hosts.selection import machine_memory as mm
from hosts.selection.bids import ON_DEMAND, Rental, rentals_to_weigh
from hosts.selection.costs import (
    SECONDS_PER_HOUR,
    CostBreakdown,
    billing_inputs,
    estimate_cost,
    startup_hours,
)
from hosts.selection.failed_start import failed_start
from hosts.selection.image_cache import NO_IMAGE_CACHE, ImageCache
from hosts.selection.preemption import PreemptionRates
from hosts.selection.profile import JobProfile
from hosts.selection.requirements import Requirements
from hosts.selection.speed import SpeedBook
from hosts.vast import Offer

# What a recovery takes besides starting again: noticing the loss and renting a replacement
# (field report: ~30 s to detect, seconds to rent).
DETECTION_S = 30.0
RENT_S = 20.0


@dataclass(frozen=True)
class RentalCost:
    """The expected total of one way of renting one offer, interruptions included."""

    rental: Rental
    gpu_usd_per_hour: float
    base: CostBreakdown  # the run with no interruption, at this GPU price
    preemptions_per_h: float
    rate_source: str
    expected_preemptions: float
    rework_h: float  # wall hours one interruption costs
    rework_usd: float  # dollars one interruption costs
    redo_h: float  # of which training done again (half a checkpoint interval)
    expected_total_usd: float
    expected_wall_h: float
    # With the team's memory of machines (else 0): the chance the start fails, what one failed
    # start costs (seconds lost; dollars billed and waited), and their product, in the total.
    start_failure_p: float = 0.0
    failed_start_s: float = 0.0
    failed_start_usd: float = 0.0
    start_risk_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, without the base breakdown (stored beside it)."""
        data = asdict(self)
        del data["base"]
        data["rental"] = {**asdict(self.rental), "label": self.rental.label}
        # JSON (and PostgreSQL's jsonb) has no infinity: "never finishes" is stored as null.
        return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in data.items()}


UNKNOWN_INTERVAL_MAX_H = 1.0


def checkpoint_interval_h(profile: JobProfile, seconds_per_step: float) -> float:
    """Hours between two checkpoints: the job's own, else a tenth of the run but at most
    ``UNKNOWN_INTERVAL_MAX_H`` (scripts that do not say rarely go hours without saving)."""
    if profile.checkpoint_every_steps:
        return profile.checkpoint_every_steps * seconds_per_step / SECONDS_PER_HOUR
    tenth = max(profile.steps_total // 10, 1) * seconds_per_step / SECONDS_PER_HOUR
    return min(tenth, UNKNOWN_INTERVAL_MAX_H)


def expected_cost(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    rental: Rental,
    rates: PreemptionRates,
    images: ImageCache = NO_IMAGE_CACHE,
    memory: mm.MachineMemory | None = None,
) -> RentalCost | None:
    """Expected total cost of the rest of the job on OFFER rented as RENTAL: the run itself
    plus λ x expected hours interruptions, each costing detection, a new rent, the start-up
    again and half a checkpoint interval of training (module docstring). None when the offer
    takes no such bid; an infinite total when interruptions come faster than the work. IMAGES
    prices this run's pull; a recovery's pull is whole (the replacement is another machine).
    With MEMORY, what the machine showed is priced in too (module docstring)."""
    price = rental.gpu_usd_per_hour(offer)
    if price is None:
        return None
    if memory is not None:
        offer, speeds = _as_remembered(memory, offer, speeds)
    base = estimate_cost(offer, profile, speeds, req, gpu_usd_per_hour=price, images=images)
    lam, source = rates.rate(rental.kind, offer.gpu_name or "", rental.bid_margin)
    if memory is not None and memory.record(offer.machine_id) is not None:
        lam, source = _machine_rate(memory, offer, rates, lam, source)
    _, storage, down_price, _, mbps = billing_inputs(offer)
    # A resume downloads the checkpoint too, whether or not this run started from one.
    again_gb = profile.image_gb + profile.model_gb + profile.checkpoint_gb
    image_h, fetch_h, start_h = startup_hours(profile, mbps, resuming=True)
    redo_h = checkpoint_interval_h(profile, base.seconds_per_step) / 2
    wait_h = (DETECTION_S + RENT_S) / SECONDS_PER_HOUR
    rework_h = wait_h + image_h + fetch_h + start_h + redo_h
    gpu_h = fetch_h + start_h + redo_h  # the pull is not GPU time; waiting bills nothing
    rework_usd = price * gpu_h + storage * req.disk_gb * (image_h + gpu_h) + again_gb * down_price
    if lam * rework_h >= 1.0:
        preemptions, wall_h, total = math.inf, math.inf, math.inf
    else:
        # Interruptions during the rework count too: N = λ (W + N r) solved for N.
        preemptions = lam * base.wall_h / (1.0 - lam * rework_h)
        wall_h = base.wall_h + preemptions * rework_h
        total = base.total_usd + preemptions * rework_usd
    cost = RentalCost(
        rental=rental,
        gpu_usd_per_hour=price,
        base=base,
        preemptions_per_h=lam,
        rate_source=source,
        expected_preemptions=preemptions,
        rework_h=rework_h,
        rework_usd=rework_usd,
        redo_h=redo_h,
        expected_total_usd=total,
        expected_wall_h=wall_h,
    )
    if memory is None:
        return cost
    return _with_start_risk(cost, memory, offer, profile, req, images)


def _as_remembered(
    memory: mm.MachineMemory, offer: Offer, speeds: SpeedBook
) -> tuple[Offer, SpeedBook]:
    """OFFER with the link its machine showed, and SPEEDS with its speed against its promise."""
    if memory.record(offer.machine_id) is None:
        return offer, speeds
    factor = mm.speed_factor(memory, offer.machine_id)
    factors = {**speeds.machine_factors, offer.machine_id: factor}
    return mm.seen_offer(memory, offer), replace(speeds, machine_factors=factors)


def _machine_rate(
    memory: mm.MachineMemory, offer: Offer, rates: PreemptionRates, lam: float, source: str
) -> tuple[float, str]:
    """λ with the machine's own host losses (``machine_memory.loss_rate_per_h``) in place of its
    GPU model's; the words say both."""
    model_host = rates.rate(ON_DEMAND, offer.gpu_name or "")[0]
    machine = mm.loss_rate_per_h(memory, offer, model_host)
    words = "the prior" if source == "prior" else source
    words += f"; machine {offer.machine_id}'s own rentals: {machine:.3f} host losses/h"
    return max(lam + machine - model_host, 0.0), words


def _with_start_risk(
    cost: RentalCost,
    memory: mm.MachineMemory,
    offer: Offer,
    profile: JobProfile,
    req: Requirements,
    images: ImageCache,
) -> RentalCost:
    """COST plus P(the start fails) x what a failed start costs (``failed_start``)."""
    p = mm.start_failure_chance(memory, offer)
    failed = failed_start(
        offer, profile, req, cost.gpu_usd_per_hour, images.chance(offer.machine_id)
    )
    risk = p * failed.total_usd
    return replace(
        cost,
        start_failure_p=p,
        failed_start_s=failed.seconds,
        failed_start_usd=failed.total_usd,
        start_risk_usd=risk,
        expected_total_usd=cost.expected_total_usd + risk,
        expected_wall_h=cost.expected_wall_h + p * failed.seconds / SECONDS_PER_HOUR,
    )


def best_rental(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    rates: PreemptionRates,
    images: ImageCache = NO_IMAGE_CACHE,
    memory: mm.MachineMemory | None = None,
) -> RentalCost | None:
    """The cheapest expected way to rent OFFER under REQ, or None when REQ allows none."""
    costs = [
        cost
        for rental in rentals_to_weigh(offer, req)
        if (cost := expected_cost(offer, profile, speeds, req, rental, rates, images, memory))
        is not None
    ]
    # Interruptions faster than the work give an infinite total: such a way ranks last, but
    # an offer whose every way is infinite (a run of thousands of hours) is still an offer.
    return min(costs, key=lambda c: (c.expected_total_usd, c.rental.bid_margin), default=None)
