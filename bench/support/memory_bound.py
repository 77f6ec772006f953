"""The team memory's evidence bound for ``bench/acquisition.py``: the best any memory could do
with the rentals the team itself saw, given the weather's true model of machines.

A memory can only know a machine through its own rentals of it. This one knows more than any
product could: the exact law the sandbox draws each machine's hidden frailty from
(``sandbox.weather.machine_traits``: its reliability factor and hosting type, times a lognormal
hidden factor of sigma ``HIDDEN_SIGMA``), and how a frailty turns into
the chance a rental fails the job (``acquisition_sim.chance_to_fail``). From the team's
rentals of a machine (n rentals, k of them incidents: never ready, lost while loading or while
running) it takes the exact posterior of that chance (Bayes' rule over a grid of the hidden
factor; every rental of the same job, so each is a Bernoulli draw of it), with no decay, since
the sandbox's traits never change. A machine's link is known once an agent of the team
measured it, as the product's memory learns it; before that, the weather's mean share of what
the offer advertises. It then rents as the memory's bound that knows the traits
does (``knowing``): of the ranked candidates at most ``GOAL_MEMORY_DEARER`` dearer per hour,
the one least likely to fail, here by that posterior. No memory with the same rentals ranks
machines better on average: the gap between the product's memory and this one is what its
estimator loses; the gap between this one and the knowing bound is what the evidence lacks.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from bench.support import acquisition_sim as sim
from sandbox.weather import (
    DATACENTER_FACTOR,
    HIDDEN_SIGMA,
    MIXES,
    machine_traits,
    reliability_factor,
)

# The hidden factor's grid: standard normal points and their weights (±4.5 sigma, 91 points:
# the posterior mean moves by under 1e-4 with a finer one).
GRID = tuple(-4.5 + 0.1 * i for i in range(91))
PRIOR = tuple(math.exp(-z * z / 2) for z in GRID)


@cache
def chances(offer_key: tuple, weather: str, seed: int, job, link_known: bool) -> tuple[float, ...]:
    """The chance a rental fails JOB on the machine of OFFER_KEY (its JSON as sorted items) for
    each point of ``GRID``: its traits with the hidden factor set to that point; its link the
    true one once LINK_KNOWN (an agent of the team measured it), else the weather's mean share
    of what it advertises (what a memory knows of a machine it never rented)."""
    offer = dict(offer_key)
    traits = machine_traits(offer, weather, seed)
    mix, base = MIXES[weather], _base(offer)
    if not link_known:
        datacenter = int(offer.get("hosting_type") or 0) == 1
        low, high = mix.link_datacenter if datacenter else mix.link_community
        share = (low + high) / 2
        advertised = max(float(offer.get("inet_down", 100.0)), 1.0)
        traits = replace(traits, link_factor=share, down_mbps=advertised * share)
    out = []
    for z in GRID:
        frailty = base * math.exp(HIDDEN_SIGMA * z - HIDDEN_SIGMA**2 / 2)
        at_z = replace(
            traits,
            frailty=frailty,
            never_ready_p=1.0 - (1.0 - mix.never_ready) ** frailty,
            load_hazard_per_h=mix.load_hazard_per_h * frailty,
            run_hazard_per_h=mix.run_hazard_per_h * frailty,
        )
        out.append(sim.chance_to_fail(at_z, job))
    return tuple(out)


def _base(offer: dict) -> float:
    """The machine's frailty without its hidden factor (``machine_traits``' formula):
    reliability x hosting type."""
    datacenter = int(offer.get("hosting_type") or 0) == 1
    reliability = offer.get("reliability2", offer.get("reliability", 0.99))
    return reliability_factor(reliability) * (DATACENTER_FACTOR if datacenter else 1.0)


def posterior_chance(p_by_z: tuple[float, ...], rentals: int, incidents: int) -> float:
    """The posterior mean chance to fail, after RENTALS of which INCIDENTS failed."""
    ok = rentals - incidents
    num = den = 0.0
    for prior, p in zip(PRIOR, p_by_z, strict=True):
        p = min(max(p, 1e-12), 1 - 1e-12)
        w = prior * p**incidents * (1 - p) ** ok
        num += w * p
        den += w
    if den > 0:
        return num / den
    return sum(w * p for w, p in zip(PRIOR, p_by_z, strict=True)) / sum(PRIOR)


def knowing_evidence(decision, market, weather: str, seed: int, rentals: dict):
    """DECISION with the machine the evidence bound rents (module docstring); RENTALS: the
    team's ended rentals per machine id (``Team.rentals``)."""
    from bench.support.acquisition_goals import GOAL_MEMORY_DEARER

    cap = decision.chosen.offer.dph_base * (1 + GOAL_MEMORY_DEARER)
    allowed = [c for c in decision.candidates if c.offer.dph_base <= cap] or [decision.chosen]

    def risk(candidate) -> float:
        raw = market.raw[candidate.offer.id]
        key = tuple(sorted((k, v) for k, v in raw.items() if not isinstance(v, list | dict)))
        seen = rentals.get(candidate.offer.machine_id, [])
        failed = sum(1 for r in seen if r.incident)
        measured = any(r.link_ratio is not None for r in seen)
        p_by_z = chances(key, weather, seed, market.job, measured)
        return posterior_chance(p_by_z, len(seen), failed)

    return replace(decision, chosen=min(allowed, key=risk))
