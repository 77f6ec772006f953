"""Hedged rents: how many instances one rent creates at once (k), on plain values.

A rent may create k >= 2 instances on different machines, the top-ranked offers; the first
whose agent registers is kept and the rest are destroyed at once (``jobs.renting.race``). That
buys time when starts fail: on Vast a rental that never gets going is found only at its start
deadline, and the next offer starts from zero then. It costs the losers (storage from creation,
their image pull where the host bills download, until the winner registers) and, when the
winner is not the top-ranked offer, the difference in the job's expected total on it.

The decision (``plan_race``): candidates are tried in rank order, k at a time. In a race the
first of the racers that get to ready wins (a host's time to ready varies around its estimate,
so two alike hosts are a coin toss: ``first_ready_odds``); when every racer fails, the next k
start once the last failure is known. For each k from 1 to ``RACE_AUTO_MAX`` this gives the
expected wait for a kept host (``W(k)``) and the expected dollars spent on instances that are
not kept, plus the kept one's premium over the top-ranked offer (``C(k)``). Racing k pays by

    value(k) = hour_value x (W(1) - W(k)) - (C(k) - C(1))

and k is the one of highest value, 1 unless some k >= 2 is worth more than nothing. The value
of an hour of waiting is the job's own GPU $/h on the host it would rent alone: an hour spent
waiting for a host delays an hour of that host's work (``jobs.renting.race``).

Each candidate's numbers (``Contender``):
- ``p_fail``: the chance it never gets an agent registered. The prior from Vast's
  ``reliability2`` is ``start_failure_prior`` (below, with its sources); ``jobs.renting.race``
  scales it by the team's own start failures.
- ``ready_s``: seconds from create to its agent's register (``time_to_ready_s``).
- ``fail_s``: seconds until a failed start is known (``failure_known_s``).
- ``usd_per_h``: what it bills while racing: its disk's storage (Vast bills storage from
  creation; the GPU only from ``running``, and a racer is destroyed at the win).
- ``pull_usd``: its whole image pull's traffic ($0 on a host that bills no download or keeps
  the image); a loser is charged the share of its way to ready it had gone.
- ``total_usd``: the job's expected total on it (the ranking's).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hosts.selection.costs import transfer_hours
from hosts.selection.failed_start import AGENT_START_S
from hosts.selection.failed_start import PROVISION_S as VAST_START_S

# ---- how many ---------------------------------------------------------------------------------
RACE_AUTO_MAX = 3  # `race = "auto"` weighs k up to this
RACE_LIMIT = 4  # `race = N` takes N up to this (JobSpec)

# ---- the chance a start fails (the prior) -----------------------------------------------------
# Vast's reliability2 is "historical uptime and health": it starts at 0.6 for a new machine and
# drops when "a client instance ... does not want to start", weighted by the host's earnings
# (Vast's docs, docs/vast-api.md §8). It measures uptime, not start success, and says little of a
# start: noema's re-baseline (monygroupcorp/noema, docs/benchmarks/2026-05-04-vastai-rebaseline.md)
# rented 10 RTX 3090s filtered on it, best first, and 1 never got to SSH within 5 minutes; 4 more
# vanished later, in the download, after SSH (4/10 succeeded). A start on our side ends at the
# agent's register, before the job's downloads: 1 in 10 is the figure for a reliable machine.
START_FAIL_RELIABLE = 0.10
RELIABLE_AT = 0.99
# Below that, each point of reliability lost adds half a point of start failure: a new machine
# (0.6) fails to start about 3 times as often as a reliable one. A guess: not published.
START_FAIL_PER_UNRELIABILITY = 0.5
START_FAIL_MAX = 0.5
NEW_MACHINE_RELIABILITY = 0.6  # what Vast gives a machine without history (a missing score)

# ---- time to ready ----------------------------------------------------------------------------
# Vast's own start besides the pull, for a host that picks the contract up: one RTX 4090 went
# from create to running in 72.8 s (dumont-cloud's integration test, 2026-01), another tool sees
# running 30-60 s after create (stationthis research notes), and Vast calls `loading` "normal for
# 30 seconds with cached images" (its FAQ).
PROVISION_S = 60.0
# The bootstrap (the agent's two packages when the image lacks them, agent.pyz from the portal)
# and the register call: seconds on the sandbox, tens on a slow package mirror.
REGISTER_S = 15.0
# The provider poll finds a vanished host within one interval (PROVIDER_POLL_INTERVAL_S).
POLL_S = 10.0
# How much a host's time to ready varies around its estimate: noema's four good rentals had
# SSH at 75, 86, 159 and 167 s, a lognormal spread of about 0.4.
READY_SPREAD = 0.4
# A start that fails either never gets going, found at its start deadline (noema's never-ready
# host), or loses its host while it pulls, found by the next poll (the way noema's hosts vanished
# while downloading); no public split for the pull alone, so half and half.
NEVER_READY_SHARE = 0.5


@dataclass(frozen=True)
class Contender:
    """One candidate of a race, in the numbers ``plan_race`` weighs (module docstring)."""

    offer_id: int
    machine_id: int | None
    p_fail: float
    ready_s: float
    fail_s: float
    usd_per_h: float
    pull_usd: float
    total_usd: float

    def cost_until(self, seconds: float) -> float:
        """What it has cost SECONDS after its create: storage, and the share of its pull made
        by then (its way to ready, taken as the pull's share)."""
        share = min(seconds / self.ready_s, 1.0) if self.ready_s > 0 else 1.0
        return self.usd_per_h * seconds / 3600.0 + self.pull_usd * share


@dataclass(frozen=True)
class Outlook:
    """What trying CONTENDERS k at a time is expected to give: the wait for a kept host (s),
    the dollars on instances not kept, and the kept one's premium over the top-ranked."""

    wait_s: float
    spent_usd: float
    premium_usd: float

    @property
    def cost_usd(self) -> float:
        return self.spent_usd + self.premium_usd


@dataclass(frozen=True)
class RacePlan:
    """How many instances to create (K) and why: the expected waits at K and alone, the wait
    saved at HOUR_VALUE_USD an hour, and the losers and premium it costs beyond renting alone.
    For K = 1 under "auto", SAVED_USD and EXTRA_USD are what racing 2 would have given (why it
    was not done)."""

    k: int
    mode: str  # "auto", "off" or "fixed" (the job's `race`)
    wait_s: float
    alone_wait_s: float
    hour_value_usd: float
    saved_usd: float
    extra_usd: float
    contenders: tuple[Contender, ...] = field(default=())  # the racers, in rank order

    @property
    def value_usd(self) -> float:
        """What racing K is worth beyond renting alone (0 when K is 1)."""
        return self.saved_usd - self.extra_usd if self.k > 1 else 0.0

    def loser_usd(self, contender: Contender) -> float:
        """What CONTENDER is expected to cost should it lose: racing until the expected win."""
        return contender.cost_until(min(self.wait_s, contender.fail_s))

    def as_dict(self) -> dict:
        """JSON-ready, for the attempt's decision."""
        return {
            "k": self.k,
            "mode": self.mode,
            "wait_s": _finite(self.wait_s),
            "alone_wait_s": _finite(self.alone_wait_s),
            "hour_value_usd": self.hour_value_usd,
            "saved_usd": _finite(self.saved_usd),
            "extra_usd": _finite(self.extra_usd),
            "racers": [
                {
                    "offer_id": c.offer_id,
                    "machine_id": c.machine_id,
                    "p_fail": round(c.p_fail, 4),
                    "ready_s": round(c.ready_s, 1),
                    "fail_s": round(c.fail_s, 1),
                    "loser_usd": round(self.loser_usd(c), 6),
                }
                for c in self.contenders
            ],
        }


def start_failure_prior(reliability: float | None) -> float:
    """The chance a rental of a machine with this ``reliability2`` never gets its agent
    registered, before anything is known of the machine or the market (module constants)."""
    r = NEW_MACHINE_RELIABILITY if reliability is None else float(reliability)
    below = max(RELIABLE_AT - r, 0.0)
    return min(START_FAIL_RELIABLE + START_FAIL_PER_UNRELIABILITY * below, START_FAIL_MAX)


def time_to_ready_s(pull_s: float) -> float:
    """Seconds from create to the agent's register: Vast's start, the image pull (PULL_S: 0 on
    a machine that holds the image) and the bootstrap. A plain estimate: the start deadlines
    from bytes (``jobs.watchdog.start_deadline``) bound the same phases, with margins."""
    return PROVISION_S + max(pull_s, 0.0) + REGISTER_S


# The watchdog's margin on an advertised link (``jobs.watchdog.start_deadline``: a host's pulls
# run well under what it advertises; tests/test_race_decision.py holds the two equal).
ADVERTISED_MARGIN = 3.0


def start_deadline_s(image_gb: float, mbps: float, *, image_held: bool, cap_s: float) -> float:
    """Seconds from create to the start deadline the watchdog holds a host that never gets going
    to (``jobs.watchdog.start_deadline.start_due`` on the offer's advertised link: Vast's start,
    the image pull at the link times its margin unless the machine holds the image, the agent's
    start), never past the job's start timeout CAP_S."""
    pull_s = 0.0 if image_held else transfer_hours(image_gb, mbps) * 3600 * ADVERTISED_MARGIN
    return min(VAST_START_S + pull_s + AGENT_START_S, cap_s)


def failure_known_s(ready_s: float, deadline_s: float) -> float:
    """Seconds from create until a failed start is known: at the start deadline (DEADLINE_S)
    for a host that never gets going, at the next poll for one lost mid-pull (module
    constants)."""
    lost_mid_pull = ready_s / 2 + POLL_S
    return NEVER_READY_SHARE * deadline_s + (1 - NEVER_READY_SHARE) * lost_mid_pull


def outlook(contenders: Sequence[Contender], k: int) -> Outlook:
    """The expected wait and dollars of trying CONTENDERS (rank order) K at a time; once the
    list is spent, more offers like them, one at a time, for every k alike."""
    best = contenders[0].total_usd if contenders else 0.0
    return _outlook(tuple(contenders), max(k, 1), best, _tail_wait(contenders))


def _outlook(contenders: tuple[Contender, ...], k: int, best: float, tail_s: float) -> Outlook:
    if not contenders:
        return Outlook(tail_s, 0.0, 0.0)
    race, rest = contenders[:k], contenders[k:]
    wait = spent = premium = 0.0
    # Every way the race can go: which racers get to ready (each with its own odds); of those,
    # the one ready first wins (``first_ready_odds``) and the rest are destroyed then.
    for ready_set in itertools.product((True, False), repeat=len(race)):
        chance = math.prod(
            (1.0 - c.p_fail) if ok else c.p_fail for c, ok in zip(race, ready_set, strict=True)
        )
        up = [c for c, ok in zip(race, ready_set, strict=True) if ok]
        if not up or chance == 0.0:
            continue
        for winner, wins in zip(up, first_ready_odds(up), strict=True):
            at = winner.ready_s
            weight = chance * wins
            wait += weight * at
            spent += weight * sum(
                c.cost_until(at if c in up else min(c.fail_s, at)) for c in race if c is not winner
            )
            premium += weight * (winner.total_usd - best)
    reach = math.prod(c.p_fail for c in race)  # every racer failed: the next k start
    then = _outlook(rest, k, best, tail_s)
    wait += reach * (max(c.fail_s for c in race) + then.wait_s)
    spent += reach * (sum(c.cost_until(c.fail_s) for c in race) + then.spent_usd)
    premium += reach * then.premium_usd
    return Outlook(wait, spent, premium)


def first_ready_odds(up: Sequence[Contender]) -> list[float]:
    """The chance each of UP (all getting to ready) is ready first. A host's time to ready is
    taken as lognormal around its ``ready_s`` with ``READY_SPREAD``: two alike hosts are a coin
    toss, one twice as fast wins about 9 times in 10. Each racer's chance of beating every other
    one, normalised (exact for two)."""
    if len(up) == 1:
        return [1.0]
    scale = READY_SPREAD * math.sqrt(2.0)
    beats = [
        math.prod(
            _normal_cdf(math.log(other.ready_s / c.ready_s) / scale)
            for other in up
            if other is not c
        )
        for c in up
    ]
    total = sum(beats)
    return [b / total for b in beats] if total > 0 else [1.0 / len(up)] * len(up)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _tail_wait(contenders: Sequence[Contender]) -> float:
    """The expected wait once the ranked list is spent: offers like the average one, tried one
    at a time (the same for every k, so it only keeps the figures whole)."""
    if not contenders:
        return 0.0
    n = len(contenders)
    p = min(sum(c.p_fail for c in contenders) / n, 0.95)
    ready = sum(c.ready_s for c in contenders) / n
    fail = sum(c.fail_s for c in contenders) / n
    return ready + p * fail / (1.0 - p)


def plan_race(
    contenders: Sequence[Contender], *, hour_value_usd: float, race: str | int = "auto"
) -> RacePlan:
    """How many of CONTENDERS (rank order, on different machines) to create at once (module
    docstring). RACE is the job's setting: "auto" weighs k = 1..``RACE_AUTO_MAX``, "off" is 1,
    N creates N (at most as many as there are contenders)."""
    contenders = tuple(contenders)
    alone = outlook(contenders, 1)
    if race == "off" or len(contenders) < 2:
        mode = "off" if race == "off" else ("fixed" if isinstance(race, int) else "auto")
        return _plan(1, mode, alone, alone, hour_value_usd, contenders)
    if isinstance(race, int):
        k = max(1, min(race, len(contenders)))
        return _plan(k, "fixed", outlook(contenders, k), alone, hour_value_usd, contenders)
    best = _plan(1, "auto", alone, alone, hour_value_usd, contenders)
    for k in range(2, min(RACE_AUTO_MAX, len(contenders)) + 1):
        plan = _plan(k, "auto", outlook(contenders, k), alone, hour_value_usd, contenders)
        if plan.value_usd > best.value_usd and plan.value_usd > 0:
            best = plan
    if best.k == 1:  # what racing 2 would have given: why it was not done
        pair = _plan(2, "auto", outlook(contenders, 2), alone, hour_value_usd, contenders)
        return RacePlan(
            1, "auto", alone.wait_s, alone.wait_s, hour_value_usd, pair.saved_usd,
            pair.extra_usd, contenders[:1],
        )  # fmt: skip
    return best


def _plan(
    k: int,
    mode: str,
    at_k: Outlook,
    alone: Outlook,
    hour_value_usd: float,
    contenders: tuple[Contender, ...],
) -> RacePlan:
    saved = hour_value_usd * (alone.wait_s - at_k.wait_s) / 3600.0
    return RacePlan(
        k=k,
        mode=mode,
        wait_s=at_k.wait_s,
        alone_wait_s=alone.wait_s,
        hour_value_usd=hour_value_usd,
        saved_usd=saved,
        extra_usd=at_k.cost_usd - alone.cost_usd,
        contenders=contenders[:k],
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
