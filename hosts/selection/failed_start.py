"""What a start that fails costs (``failed_start``): the time until it is given up, and the
money it bills meanwhile. ``rental_costs.expected_cost`` charges an offer P(fail) x this
(``machine_memory.start_failure_chance``).

A start is given up at its deadline from bytes: Vast's own start, the image pull at the link,
and the agent's start (``failed_start_seconds``): the start deadline's sum
(``jobs.watchdog.start_deadline``) without its safety margin, with its defaults
(``START_PROVISION_S``, ``START_BOOTSTRAP_S``; ``tests/test_machine_memory.py`` holds them
equal). The margin keeps a slow but healthy host from being abandoned, while the time a failure
costs on average is nearer the unmargined sum (a never-ready host is waited on to the deadline;
one that vanishes mid-pull is seen at the next poll). Selection cannot read the settings (it
decides on plain data), so the figures are written here as well.

Money: storage is billed from creation and bandwidth in any state, the GPU only from
``running`` (docs/vast-api.md §7): a failed start bills storage for its time and the image's
traffic (the whole pull: the dear side), never GPU time. The time is valued at the job's own
GPU $/h, as ``hosts.wait_or_move`` values an hour not training.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosts.selection.costs import SECONDS_PER_HOUR, billing_inputs, transfer_hours
from hosts.selection.profile import JobProfile
from hosts.selection.requirements import Requirements
from hosts.vast import Offer

# Vast's start besides the pull: "2-5 minutes (not counting Docker image pull time)" (vast-ai/docs
# manage-instances and quickstart), its top, as the start deadline takes it.
PROVISION_S = 300.0
# The agent's start once the container runs (bootstrap, fetching agent.pyz, registering).
AGENT_START_S = 60.0
# Renting the next offer after the failure (``rental_costs.RENT_S``'s figure).
NEXT_RENT_S = 20.0


@dataclass(frozen=True)
class FailedStart:
    """One failed start: SECONDS lost, BILLED_USD (storage and the pull's traffic) and
    WAITING_USD (those seconds at the job's GPU $/h)."""

    seconds: float
    billed_usd: float
    waiting_usd: float

    @property
    def total_usd(self) -> float:
        return self.billed_usd + self.waiting_usd


def failed_start_seconds(image_gb: float, mbps: float, cached_chance: float = 0.0) -> float:
    """Seconds until a failed start is given up and the next offer rented: Vast's start, the
    pull of IMAGE_GB (less what the machine may hold) at MBPS, the agent's start, a new rent."""
    pull_s = transfer_hours(image_gb * (1.0 - cached_chance), mbps) * SECONDS_PER_HOUR
    return PROVISION_S + pull_s + AGENT_START_S + NEXT_RENT_S


def failed_start(
    offer: Offer,
    profile: JobProfile,
    req: Requirements,
    usd_per_hour: float,
    cached_chance: float = 0.0,
) -> FailedStart:
    """What one failed start of PROFILE on OFFER costs, renting at USD_PER_HOUR (the module
    docstring). OFFER's ``inet_down`` is the link the pull gets (``machine_memory.seen_offer``
    puts in what the machine really showed)."""
    _, storage, down_price, _, mbps = billing_inputs(offer)
    seconds = failed_start_seconds(profile.image_gb, mbps, cached_chance)
    hours = seconds / SECONDS_PER_HOUR
    pulled_gb = profile.image_gb * (1.0 - cached_chance)
    return FailedStart(
        seconds=seconds,
        billed_usd=storage * req.disk_gb * hours + pulled_gb * down_price,
        waiting_usd=usd_per_hour * hours,
    )
