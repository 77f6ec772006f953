"""A seeded, event-by-event simulation of jobs renting on-demand or interruptible Vast GPUs.

``bench/selection.py`` runs it; it needs nothing but ``hosts.selection``, the sandbox's bid
constants (``sandbox.bids``) and a market file.

The simulated market's truth is drawn here, once per run, and is NOT the cost model's prior
(``hosts.selection.prior_rate``): the policies never see it, they only see what happened.

==========================  ==================================================================
outbid at min_bid, per GPU  lognormal: median 0.5/h x popularity (RTX 4090, RTX 3090: x1.6;
model                       datacenter cards: x0.5; the rest x1), sigma ``MODEL_SIGMA``
per machine                 that rate x a lognormal factor of mean 1 (sigma ``MACHINE_SIGMA``):
                            bids are per machine, some machines are fought over more
bid margin                  outbid rate x exp(-margin / ``TRUE_MARGIN_SCALE``) (the prior: 0.25),
                            the margin over the machine's min_bid at the time of the bid
the outbidder's bid         our price x (1 + U(``RIVAL_OVERBID``)), 4 decimals: the machine's
                            min_bid while the outbidder holds it, for this job and later ones
the outbidder's hold        exponential, mean ``RIVAL_HOLD_MEAN_H`` = the sandbox's
                            ``BidSettings.hold_h`` (2 h; ``sandbox/bids.py``), from the
                            outbid; then the machine's min_bid falls back to what it was before
                            (the highest bid of another outbidder still holding it, else the
                            market file's: the sandbox's hourly min_bid walk is not modelled).
                            The hold runs its course whether or not we raise over it (on Vast
                            the outbid tenant's paused job is not finished; the sandbox, whose
                            instances see one rival at a time, drops it when a raise wins)
clock                       one per policy: its jobs run back to back, each submitted when the
                            one before finishes; holds are counted on it
host loss, per machine      -ln(reliability) / 24 per hour: ``reliability`` read as the chance
                            the machine stays up for a day (the prior: 0.02/h for every host)
speed                       reference s/step x the market's hidden ``sim_speed_factor``
downloads                   at the offer's advertised ``inet_down``
==========================  ==================================================================

One attempt, from the rent: the image pull (storage and traffic, no GPU), then the model (and
checkpoint, when resuming) download and the container start, then training; a checkpoint every
``checkpoint_every_steps`` uploads its share of ``upload_gb``. Host losses and outbids come at
exponential times of their true rates while the instance runs (counted from the rent: a bid can
be outbid while loading), each from its own seeded stream. Either loses the steps since the
last checkpoint and is noticed ``DETECTION_S`` later (storage billed until then).

A host loss, or an outbid the policy does not answer by raising, ends the attempt: the job
rents again ``RENT_S`` later, deciding again with the machine on its own avoid list (no other
job avoids it: ``jobs.lifecycle.handle_loss``), its observed speeds in its ``SpeedBook`` and the
team's observed history in ``PreemptionRates``, as ``jobs/renting/rent.py`` does. ``auto`` answers
each outbid with the product's own code, as ``jobs.watchdog.outbids.outbid_choice_for`` calls it:
``jobs.rent_decision.RentDecision.outbid_choice`` on the attempt's ``Decision.as_dict()``, with
the steps left from the newest checkpoint, the attempt's observed s/step (None before the
agent reported one), its margin, the machine's min_bid now, the job's ``max_bid_dph`` and the
team's rates (this attempt's hours and raises so far included, as
``jobs.renting.interruption_rates.preemption_rates`` counts a live attempt). When it says raise, the
bid becomes its ``raise_to`` and the same container starts again on the same host once the outbid is
noticed: no image pull, no downloads (an unfinished pull or download goes on from where it
stopped), the container start, then training from the newest checkpoint, at the new price
and the same margin over the new min_bid (so at the same true rate, even after the
outbidder's hold ends). ``min-bid`` never raises (SkyPilot, dstack); on-demand is never
outbid. Traffic is charged for the bytes moved. The history counts what
``jobs.renting.interruption_rates.preemption_rates`` counts: per attempt, its hours and its
interruptions, i.e. its loss (an ``Interruption``) if it ended by one plus the outbids it answered
by raising (``Attempt.outbids``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hosts.selection import (
    AUTO,
    INTERRUPTIBLE,
    ON_DEMAND,
    Decision,
    JobProfile,
    PreemptionRates,
    Rental,
    Requirements,
    SpeedBook,
    choose_offer,
    margin_bucket,
    transfer_hours,
)
from hosts.vast import Offer
from jobs.rent_decision import RentDecision
from sandbox.bids import BidSettings

SECONDS_PER_HOUR = 3600.0
# The truth (module docstring). Different from the prior on purpose: 0.5/h and 0.25.
MEDIAN_OUTBID_PER_H = 0.5
POPULAR = frozenset({"RTX 4090", "RTX 3090"})
POPULAR_FACTOR = 1.6
DATACENTER_PREFIXES = ("A100", "H100", "H200", "L40", "A40", "A10", "Tesla", "RTX A6000")
DATACENTER_FACTOR = 0.5
MODEL_SIGMA = 0.5
MACHINE_SIGMA = 0.5
TRUE_MARGIN_SCALE = 0.2
RIVAL_OVERBID = (0.02, 0.30)  # the outbidder bids this much over our price (uniform)
# The outbidder keeps the machine an exponential time of this mean, as the sandbox's tenants
# do (``sandbox.bids.BidSettings.hold_h``, ``--outbid-hold-h``): one truth for both.
RIVAL_HOLD_MEAN_H = BidSettings.hold_h
HOURS_PER_RELIABILITY_PERIOD = 24.0
DETECTION_S = 30.0  # the watchdog notices a loss (field report)
RENT_S = 20.0  # search, choose and create the replacement
MAX_ATTEMPTS = 50  # a job that cannot finish in this many rentals is counted as it stands

MIN_BID = "min-bid"
POLICIES = (AUTO, ON_DEMAND, MIN_BID)


@dataclass(frozen=True)
class Truth:
    """What the simulated market really does; hidden from every policy."""

    outbid_per_h: Mapping[int, float]  # by offer id, at min_bid (model rate x machine factor)
    host_loss_per_h: Mapping[int, float]  # by offer id
    speed_factor: Mapping[int, float]  # by offer id: the market's sim_speed_factor
    model_outbid_per_h: Mapping[str, float]  # the per-model draw, for the report

    def outbid_rate(self, offer: Offer, rental: Rental) -> float:
        """True outbids per running hour of OFFER rented as RENTAL (0 on demand)."""
        if rental.kind != INTERRUPTIBLE:
            return 0.0
        return self.outbid_per_h[offer.id] * math.exp(-rental.bid_margin / TRUE_MARGIN_SCALE)

    def rate(self, offer: Offer, rental: Rental) -> float:
        """True interruptions per rented hour of OFFER rented as RENTAL."""
        return self.host_loss_per_h[offer.id] + self.outbid_rate(offer, rental)


def _model_factor(gpu_name: str) -> float:
    if gpu_name in POPULAR:
        return POPULAR_FACTOR
    if gpu_name.startswith(DATACENTER_PREFIXES):
        return DATACENTER_FACTOR
    return 1.0


def draw_truth(
    offers: Sequence[Offer], speed_factor: Mapping[int, float], rng: random.Random
) -> Truth:
    """One market's truth: per GPU model, then per machine (module docstring)."""
    models = sorted({o.gpu_name for o in offers})
    by_model = {
        m: MEDIAN_OUTBID_PER_H * _model_factor(m) * math.exp(rng.gauss(0.0, MODEL_SIGMA))
        for m in models
    }
    outbid, host_loss = {}, {}
    for o in sorted(offers, key=lambda o: o.id):
        machine = math.exp(rng.gauss(0.0, MACHINE_SIGMA) - MACHINE_SIGMA**2 / 2)  # mean 1
        outbid[o.id] = by_model[o.gpu_name] * machine
        reliability = min(max(o.reliability or 0.9, 1e-6), 1.0)
        host_loss[o.id] = -math.log(reliability) / HOURS_PER_RELIABILITY_PERIOD
    return Truth(outbid, host_loss, dict(speed_factor), by_model)


@dataclass
class History:
    """The team's observed interruptions and rented hours, as ``jobs.renting`` counts them."""

    seen: dict[tuple[str, str, float], list[float]] = field(default_factory=dict)
    true_exposure: dict[tuple[str, str, float], float] = field(default_factory=dict)

    @staticmethod
    def key(offer: Offer, rental: Rental) -> tuple[str, str, float]:
        margin = margin_bucket(rental.bid_margin) if rental.kind == INTERRUPTIBLE else 0.0
        return rental.kind, offer.gpu_name or "", margin

    def add(self, offer: Offer, rental: Rental, hours: float, cuts: int, true_rate: float):
        """One attempt: its rented HOURS and its CUTS (its loss, if it ended by one, plus the
        outbids it answered by raising: ``Interruption`` rows plus ``Attempt.outbids``)."""
        key = self.key(offer, rental)
        counts = self.seen.setdefault(key, [0, 0.0])
        counts[0] += cuts
        counts[1] += hours
        self.true_exposure[key] = self.true_exposure.get(key, 0.0) + true_rate * hours

    def rates(self, live: tuple[Offer, Rental, float, int] | None = None) -> PreemptionRates:
        """What ``choose_offer`` is given: the prior blended in by ``PreemptionRates``. LIVE:
        an attempt still running (offer, rental, hours so far, outbids raised so far), which
        ``jobs.renting.interruption_rates.preemption_rates`` counts up to now."""
        seen = {k: (int(n), h) for k, (n, h) in self.seen.items()}
        if live is not None:
            offer, rental, hours, cuts = live
            key = self.key(offer, rental)
            n, h = seen.get(key, (0, 0.0))
            seen[key] = (n + cuts, h + hours)
        return PreemptionRates(seen)


class Market:
    """The offers as a policy's jobs see them, on that policy's clock (its jobs run back to
    back): every outbid makes the outbidder's bid the machine's min_bid until the outbidder's
    hold ends, then it falls back to what it was before (module docstring)."""

    def __init__(self, offers: Sequence[Offer]):
        self._offers = list(offers)
        self.now_h = 0.0  # hours since the policy's first job was submitted
        self.rivals: dict[int, list[tuple[float, float]]] = {}  # offer id: (bid, until hour)

    def min_bid(self, offer: Offer, at_h: float) -> float | None:
        """OFFER's min_bid at hour AT_H: the highest bid of an outbidder holding it, else the
        market file's."""
        held = [bid for bid, until in self.rivals.get(offer.id, ()) if until > at_h]
        return max([*held, offer.min_bid]) if held and offer.min_bid else offer.min_bid

    def offers(self) -> list[Offer]:
        """Every offer, at its min_bid now."""
        for oid in [i for i, r in self.rivals.items() if all(u <= self.now_h for _, u in r)]:
            del self.rivals[oid]  # every hold on it is over: back to the market file's min_bid
        return [
            replace(o, min_bid=self.min_bid(o, self.now_h)) if o.id in self.rivals else o
            for o in self._offers
        ]

    def outbid(self, offer: Offer, price: float, at_h: float, streams: _Streams) -> float:
        """OFFER, rented at PRICE, is outbid at hour AT_H: the outbidder bids over PRICE and
        holds the machine an exponential time (``sandbox.bids.BidMarket.hold_s``'s
        draw); OFFER's min_bid now."""
        lo, hi = RIVAL_OVERBID
        bid = round(price * (1.0 + streams.rival.uniform(lo, hi)), 4)
        u = streams.hold.random()
        hold_h = (
            math.inf if math.isinf(RIVAL_HOLD_MEAN_H) else -math.log(1.0 - u) * RIVAL_HOLD_MEAN_H
        )
        self.rivals.setdefault(offer.id, []).append((bid, at_h + hold_h))
        return self.min_bid(offer, at_h) or bid


@dataclass(frozen=True)
class JobResult:
    """One simulated job: its true cost, its wall hours from first rent to last step."""

    usd: float
    wall_h: float
    attempts: int
    interruptions: int  # host losses and outbids, raised or not
    interruptible_rentals: int
    finished: bool
    outbids: int = 0
    raised: int = 0  # outbids answered by raising the bid and staying


def decide(
    policy: str,
    offers: Sequence[Offer],
    req: Requirements,
    profile: JobProfile,
    book: SpeedBook,
    rates: PreemptionRates,
) -> Decision | None:
    """What the policy rents, or None when nothing qualifies: ``choose_offer`` for all three,
    ``min-bid`` as interruptible with the one margin 0."""
    if policy == MIN_BID:
        req = replace(req, rental=INTERRUPTIBLE, bid_margins=(0.0,))
    else:
        req = replace(req, rental=policy)
    return choose_offer(offers, req, profile, book, rates=rates)


def _checkpoints(done: int, reached: int, every: int, total: int) -> int:
    """Checkpoints written going from step DONE to step REACHED (the last step writes one)."""
    return reached // every - done // every + (reached == total and total % every != 0)


@dataclass
class _Streams:
    """One job's seeded draws, one stream per kind, so that policies share them as far as
    their choices allow (common random numbers)."""

    host: random.Random
    outbid: random.Random
    rival: random.Random
    hold: random.Random

    @classmethod
    def of(cls, rng: random.Random) -> _Streams:
        return cls(*(random.Random(rng.getrandbits(64)) for _ in range(4)))

    @staticmethod
    def cut(rng: random.Random, rate: float) -> float:
        return rng.expovariate(rate) if rate > 0 else math.inf


@dataclass
class _Attempt:
    """What one rental came to: its cost and hours, the steps saved, how it ended."""

    usd: float = 0.0
    wall_h: float = 0.0  # rent to the end of training or to the loss being noticed
    exists_h: float = 0.0  # storage billed
    saved: int = 0
    lost: bool = False
    outbids: int = 0
    raised: int = 0
    observed_sps: float | None = None


def run_attempt(
    policy: str,
    decision: Decision,
    req: Requirements,
    profile: JobProfile,
    truth: Truth,
    market: Market,
    history: History,
    streams: _Streams,
) -> _Attempt:
    """One rental of DECISION's chosen offer from the rent (at the market's hour now) to its
    end (module docstring)."""
    offer, rental = decision.chosen.offer, decision.chosen.rental.rental
    price = decision.chosen.rental.gpu_usd_per_hour
    total, done = profile.steps_total, profile.steps_done
    every = profile.checkpoint_every_steps or max(total // 10, 1)  # as the model
    upload_per_ckpt = profile.upload_gb / math.ceil(total / every)
    mbps = offer.inet_down_mbps or 1.0
    sps = profile.reference_seconds_per_step * truth.speed_factor[offer.id]
    fetch_gb = profile.model_gb + (profile.checkpoint_gb if done > 0 else 0.0)
    image_h = transfer_hours(profile.image_gb, mbps)
    fetch_h = transfer_hours(fetch_gb, mbps)
    start_h = profile.container_start_s / SECONDS_PER_HOUR
    host_rate, outbid_rate = truth.host_loss_per_h[offer.id], truth.outbid_rate(offer, rental)
    image_left, fetch_left = image_h, fetch_h
    moved_gb = 0.0
    out = _Attempt(saved=done)
    while True:  # one run of the container: from the rent, then after each raised bid
        run_at_h = market.now_h + out.wall_h
        ready_h = image_left + fetch_left + start_h
        end_h = ready_h + (total - done) * sps / SECONDS_PER_HOUR
        host_cut = _Streams.cut(streams.host, host_rate)
        outbid_cut = _Streams.cut(streams.outbid, outbid_rate)
        cut_h = min(host_cut, outbid_cut)
        interrupted = cut_h < end_h
        up_h = cut_h if interrupted else end_h
        reached = total
        if interrupted:
            trained_s = max(up_h - ready_h, 0.0) * SECONDS_PER_HOUR
            reached = min(done + int(trained_s / sps), total - 1)
        saved = reached if reached == total else max(reached // every * every, done)
        pulled_h = min(up_h, image_left)
        fetched_h = min(max(up_h - image_left, 0.0), fetch_left)
        if image_h > 0:
            moved_gb += profile.image_gb * pulled_h / image_h
        if fetch_h > 0:
            moved_gb += fetch_gb * fetched_h / fetch_h
        out.usd += price * (up_h - pulled_h) + _checkpoints(
            done, reached, every, total
        ) * upload_per_ckpt * (offer.upload_usd_per_gb or 0.0)
        out.wall_h += up_h
        out.exists_h += up_h
        out.saved = saved
        if up_h > ready_h:  # the agent reported its speed before it was cut off
            out.observed_sps = sps
        if not interrupted:
            break
        out.wall_h += DETECTION_S / SECONDS_PER_HOUR
        out.exists_h += DETECTION_S / SECONDS_PER_HOUR
        if outbid_cut > host_cut:
            out.lost = True
            break
        out.outbids += 1
        new_min_bid = market.outbid(offer, price, run_at_h + up_h, streams)
        if policy != AUTO:
            out.lost = True
            break
        # jobs.watchdog.outbids.outbid_choice_for: the attempt's stored decision, the steps left
        # from the newest checkpoint, its observed s/step, its margin, the machine's min_bid now,
        # the job's max bid and the team's rates (this attempt's hours and raises so far too).
        choice = RentDecision(decision.as_dict()).outbid_choice(
            machine_id=offer.machine_id,
            steps_left=max(total - saved, 0),
            seconds_per_step=out.observed_sps,
            bid_margin=rental.bid_margin,
            new_min_bid=new_min_bid,
            max_bid_dph=req.max_bid_dph,
            rates=history.rates((offer, rental, out.exists_h, out.raised)),
        )
        if choice.raise_to is None:
            out.lost = True
            break
        out.raised += 1
        price = choice.raise_to
        image_left -= pulled_h
        fetch_left -= fetched_h
        done = saved
    out.usd += (offer.storage_usd_per_gb_hour or 0.0) * req.disk_gb * out.exists_h
    out.usd += moved_gb * (offer.download_usd_per_gb or 0.0)
    return out


def run_job(
    policy: str,
    market: Market,
    req: Requirements,
    profile: JobProfile,
    truth: Truth,
    history: History,
    rng: random.Random,
) -> JobResult:
    """One job from its first rent to its last step (module docstring)."""
    streams = _Streams.of(rng)
    usd = wall_h = 0.0
    done = attempts = cuts = interruptible = outbids = raised = 0
    avoid: set[int] = set()
    by_machine: dict[int, float] = {}
    by_model: dict[str, float] = {}
    while done < profile.steps_total and attempts < MAX_ATTEMPTS:
        now_req = replace(req, avoid_machine_ids=frozenset(avoid))
        now_profile = replace(profile, steps_done=done)
        book = SpeedBook(by_machine=by_machine, by_model=by_model)
        decision = decide(policy, market.offers(), now_req, now_profile, book, history.rates())
        if decision is None:  # everything avoided: forget the list, as a person would
            if not avoid:
                break
            avoid.clear()
            continue
        offer, rental = decision.chosen.offer, decision.chosen.rental.rental
        attempts += 1
        interruptible += rental.kind == INTERRUPTIBLE
        run = run_attempt(policy, decision, now_req, now_profile, truth, market, history, streams)
        market.now_h += run.wall_h
        usd += run.usd
        wall_h += run.wall_h
        outbids += run.outbids
        raised += run.raised
        cut = run.raised + run.lost
        cuts += cut
        history.add(offer, rental, run.exists_h, cut, truth.rate(offer, rental))
        if run.observed_sps is not None:
            by_machine[offer.machine_id or 0] = run.observed_sps
            by_model[offer.gpu_name] = run.observed_sps
        done = run.saved
        if not run.lost:
            break
        wall_h += RENT_S / SECONDS_PER_HOUR
        market.now_h += RENT_S / SECONDS_PER_HOUR
        if offer.machine_id is not None:
            avoid.add(offer.machine_id)
    finished = done >= profile.steps_total
    return JobResult(usd, wall_h, attempts, cuts, interruptible, finished, outbids, raised)


@dataclass(frozen=True)
class PolicyRun:
    """Every job of one policy, and the history it learned from."""

    policy: str
    jobs: tuple[JobResult, ...]
    history: History
    market: Market

    @property
    def mean_usd(self) -> float:
        return statistics.fmean(j.usd for j in self.jobs)

    def wall_p(self, pct: int) -> float:
        walls = sorted(j.wall_h for j in self.jobs)
        if len(walls) == 1:
            return walls[0]
        return statistics.quantiles(walls, n=100, method="inclusive")[pct - 1]

    @property
    def interruptions_per_job(self) -> float:
        return statistics.fmean(j.interruptions for j in self.jobs)

    @property
    def interruptible_share(self) -> float:
        rentals = sum(j.attempts for j in self.jobs)
        return sum(j.interruptible_rentals for j in self.jobs) / max(rentals, 1)

    @property
    def unfinished(self) -> int:
        return sum(not j.finished for j in self.jobs)

    @property
    def outbids(self) -> int:
        return sum(j.outbids for j in self.jobs)

    @property
    def raised(self) -> int:
        return sum(j.raised for j in self.jobs)


def simulate(
    offers: Sequence[Offer],
    speed_factor: Mapping[int, float],
    req: Requirements,
    profiles: Sequence[JobProfile],
    *,
    n_jobs: int,
    seed: int,
    outbids: bool = True,
) -> tuple[Truth, dict[str, PolicyRun]]:
    """N_JOBS jobs in sequence under each policy, on one truth drawn from SEED (without
    OUTBIDS: the same truth with no other tenant ever outbidding, the bound on what bidding
    can save on this market).

    One ``random.Random(seed)`` draws the truth, then each job's shape (one of PROFILES) and
    a seed for that job's interruption draws; every policy replays the same jobs with the
    same per-job seeds (common random numbers), each learning from its own history, on its own
    copy of the market (the min_bids its outbids moved)."""
    rng = random.Random(seed)
    truth = draw_truth(offers, speed_factor, rng)
    if not outbids:
        truth = replace(truth, outbid_per_h=dict.fromkeys(truth.outbid_per_h, 0.0))
    jobs = [(rng.choice(profiles), rng.getrandbits(64)) for _ in range(n_jobs)]
    runs = {}
    for policy in POLICIES:
        history, market = History(), Market(offers)
        results = tuple(
            run_job(policy, market, req, profile, truth, history, random.Random(job_seed))
            for profile, job_seed in jobs
        )
        runs[policy] = PolicyRun(policy, results, history, market)
    return truth, runs
