"""The interruptible market: a moving ``min_bid`` per machine, and other tenants who outbid.

What Vast says, and what is modelled on it:

- Interruptible instances "use a bidding system for priority. The higher the bid for a given
  instance, the higher priority that instance has on the machine. Lower priority instances are
  paused until they become the highest priority, either through a raised bid or the higher bid
  finishing their job" (docs.vast.ai, "Instance details" / "Rental types"). The FAQ: a lost bid
  means "Your instance is stopped (killing running processes)" (docs.vast.ai
  ``documentation/reference/faq/rental-types``). How an outbid instance reads (``cur_state``,
  ``intended_status`` and ``next_state`` all ``stopped``) is dstack's observation (dstackai/dstack
  ``src/dstack/_internal/core/backends/vastai/compute.py``); ``engine/outbids.py`` applies it.
- ``min_bid`` is the price a bid must reach to win the machine now; Vast does not publish how it
  moves. Here it is a **seeded bounded random walk**: every sandbox hour each ask's ``min_bid``
  is multiplied by ``1 + U(-p, p)`` (``p`` = ``--min-bid-step-pct`` / 100), rounded to 4
  decimals and clamped to ``[0.3 * dph_base, dph_base]`` (widened to take in the market file's
  own value). A walk that rises above a bid outbids that instance at once: "highest bid wins"
  as the loser sees it.
- Other tenants' bids arrive, per running interruptible instance, as a **Poisson process**
  whose rate falls with our margin over the floor::

      margin  m    = our bid / current min_bid - 1
      rate  λ(m)   = base_rate_per_h * exp(-m / margin_scale)      (per sandbox hour)

  (``--outbid-rate-per-h``, default 0.3; ``--outbid-margin-scale``, default 0.25: a bid 25 %
  over the floor is outbid e times less often than one at the floor). It is our own model:
  Vast publishes no interruption rates. The winner bids 1-25 % over the higher of our bid and
  the floor (``rival_bid``), which is the instance's ``min_bid`` while it holds the machine,
  and keeps it for an exponential time of mean ``--outbid-hold-h`` sandbox hours (``inf``:
  until outbid in turn); then the instance resumes, as the docs say.

Sandbox hours are the time scale's (``Timing.hour_s``: 3600 s * scale of wall time; ``--fast``
makes one 36 s), not clamped like phases. Every draw comes from ``--seed`` (0 when none is
given), the instance id and the draw's index, and the hazard is integrated exactly between
ticks, so with the same seed and bids an instance is outbid after the same running hours.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass

# min_bid's bounds as shares of the on-demand GPU price (dph_base).
MIN_BID_FLOOR_SHARE = 0.3
MIN_BID_CEILING_SHARE = 1.0
# The winning tenant's bid: this much over the higher of ours and the floor (uniform).
RIVAL_OVERBID = (0.01, 0.25)
PRICE_STEP = 0.0001  # bids and min_bids are served with 4 decimals


@dataclass(frozen=True)
class BidSettings:
    """The interruptible market's knobs (server flags); 0 turns each process off."""

    outbid_rate_per_h: float = 0.3
    margin_scale: float = 0.25
    hold_h: float = 2.0
    min_bid_step_pct: float = 5.0

    @classmethod
    def off(cls) -> BidSettings:
        """No random outbids and a fixed min_bid (the ``--fast`` default)."""
        return cls(outbid_rate_per_h=0.0, min_bid_step_pct=0.0)


def outbid_rate_per_h(margin: float, base_per_h: float, margin_scale: float) -> float:
    """λ(margin) = base * exp(-margin / scale): outbids per sandbox hour of running."""
    if base_per_h <= 0:
        return 0.0
    return base_per_h * math.exp(-max(margin, 0.0) / margin_scale)


def min_bid_bounds(dph_base: float, start: float) -> tuple[float, float]:
    """The walk's range in whole price steps, widened to take in the market file's value."""
    lo = math.ceil(MIN_BID_FLOOR_SHARE * dph_base / PRICE_STEP - 1e-9) * PRICE_STEP
    hi = math.floor(MIN_BID_CEILING_SHARE * dph_base / PRICE_STEP + 1e-9) * PRICE_STEP
    return min(round(lo, 4), start), max(round(hi, 4), start)


def _draw(seed: int, *key: object) -> float:
    """A uniform [0, 1) number fixed by the seed and KEY."""
    return random.Random(":".join(str(k) for k in (seed, *key))).random()


class BidMarket:
    """The min_bid walk of every ask and the seeded draws of the outbid process."""

    def __init__(
        self,
        offers: dict[int, dict],
        settings: BidSettings,
        seed: int | None,
        hour_s: float,
        epoch: float,
    ) -> None:
        self.offers = offers
        self.settings = settings
        self.seed = 0 if seed is None else seed
        self.hour_s = hour_s  # wall seconds per sandbox hour
        self.epoch = epoch  # wall time of the walk's step 0 (kept in the state file)
        self._walks: dict[int, tuple[int, float, random.Random]] = {}
        self._lock = threading.Lock()

    # ---- min_bid ----------------------------------------------------------------------

    @property
    def walking(self) -> bool:
        return self.settings.min_bid_step_pct > 0

    def step(self, t: float) -> int:
        return max(0, math.floor((t - self.epoch) / self.hour_s))

    def next_change(self, t: float) -> float:
        """When the walk next moves after wall time T (inf when it does not walk)."""
        if not self.walking:
            return math.inf
        k = self.step(t) + 1
        while self.epoch + k * self.hour_s <= t:  # T on a step boundary, rounded down
            k += 1
        return self.epoch + k * self.hour_s

    def floor(self, ask_id: int, t: float) -> float:
        """The ask's ``min_bid`` from the walk alone, at wall time T."""
        offer = self.offers.get(ask_id) or {}
        start = float(offer.get("min_bid") or 0.0)
        if not self.walking or not offer:
            return start
        k = self.step(t)
        with self._lock:
            done, value, rng = self._walks.get(ask_id, (0, start, None))
            if rng is None or k < done:
                done, value = 0, start
                rng = random.Random(f"{self.seed}:min_bid:{ask_id}")
            lo, hi = min_bid_bounds(float(offer.get("dph_base") or start), start)
            p = self.settings.min_bid_step_pct / 100.0
            for _ in range(k - done):
                value = min(hi, max(lo, round(value * (1.0 + rng.uniform(-p, p)), 4)))
            self._walks[ask_id] = (k, value, rng)
            return value

    # ---- the outbid process ----------------------------------------------------------

    def rate(self, price: float, floor: float) -> float:
        """λ for a bid of PRICE over a floor of FLOOR (outbids per sandbox hour)."""
        if floor <= 0:
            return 0.0
        s = self.settings
        return outbid_rate_per_h(price / floor - 1.0, s.outbid_rate_per_h, s.margin_scale)

    def threshold(self, instance_id: int, draw: int | str) -> float:
        """The unit-exponential hazard at which the instance's DRAW-th outbid happens."""
        return -math.log(1.0 - _draw(self.seed, instance_id, "outbid", draw))

    def rival_bid(self, instance_id: int, draw: int | str, price: float, floor: float) -> float:
        """What the tenant who outbids us bids: 1-25 % over the higher of our bid and the floor,
        and never less than one price step over ours."""
        lo, hi = RIVAL_OVERBID
        over = lo + (hi - lo) * _draw(self.seed, instance_id, "rival", draw)
        return max(round(max(price, floor) * (1.0 + over), 4), round(price + PRICE_STEP, 4))

    def hold_s(self, instance_id: int, draw: int | str) -> float | None:
        """Wall seconds the winner keeps the machine (exponential); None: until outbid."""
        mean_h = self.settings.hold_h
        if math.isinf(mean_h):
            return None
        u = _draw(self.seed, instance_id, "hold", draw)
        return -math.log(1.0 - u) * mean_h * self.hour_s
