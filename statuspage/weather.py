"""Market weather on the status page: per GPU model, what the team's own rentals in the window
met (``market_weather``). Definitions, also in ``statuspage/README.md``:

- **Rentals**: the team's attempts rented in the window (``rented_at``), by the GPU model of the
  offer rented. A model shows only with at least ``MIN_RENTALS`` of them: fewer says more about
  luck than about the market, and a handful of rentals could be told apart. No machine id, job,
  host or price ever appears: counts, durations and rates per GPU model only.
- **Rent → ready**: from the rent to the agent's registration (the host up and our agent in
  it), median and p90 (nearest-rank) over the rentals that got ready.
- **Start success** (the issue's "first-attempt success", counted per rental, not per job): of
  the rentals whose start was decided, the share that got ready. A start is decided when the
  agent registered, or when the host was lost before it did; a rental cancelled before its host
  came up, or still starting, is neither.
- **Losses per rented hour**: the host losses of those rentals (``Interruption`` rows, outbids
  left out: they follow the team's bids, not the market's machines) over their hours rented,
  rent to end (or now). Fire drills (``Interruption.drill``) are ours, not the market's: left
  out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, OuterRef

from jobs.models import Attempt, Interruption
from nomadgpu.models import Team

MIN_RENTALS = 20
OUTBID = "outbid"  # jobs.lifecycle.OUTBID: a higher bid, not the market's machine


@dataclass(frozen=True)
class ModelWeather:
    """One GPU model's weather over the window (module docstring); READY_S: seconds from rent
    to ready of the rentals that got ready."""

    gpu_name: str
    rentals: int
    ready_s: tuple[float, ...]
    decided: int
    ready: int
    losses: int
    rented_h: float

    @property
    def start_success(self) -> float | None:
        return self.ready / self.decided if self.decided else None

    @property
    def losses_per_h(self) -> float | None:
        return self.losses / self.rented_h if self.rented_h > 0 else None


@dataclass(frozen=True)
class MarketWeather:
    """The models with at least ``MIN_RENTALS`` rentals (most rented first), and how many
    models were rented fewer times (counted, never named)."""

    models: tuple[ModelWeather, ...]
    hidden_models: int
    min_rentals: int = MIN_RENTALS


def market_weather(team: Team, *, since: datetime, now: datetime) -> MarketWeather:
    """TEAM's rentals of SINCE..NOW, per GPU model (module docstring)."""
    host_lost = Interruption.objects.filter(attempt=OuterRef("pk"), drill=False).exclude(
        cause=OUTBID
    )
    rows = (
        Attempt.objects.filter(job__team=team, rented_at__gte=since, rented_at__lte=now)
        .exclude(gpu_name="")
        .annotate(lost=Exists(host_lost))
        .values_list("gpu_name", "rented_at", "registered_at", "ended_at", "lost")
    )
    by_model: dict[str, list[tuple]] = defaultdict(list)
    for gpu, *rest in rows:
        by_model[gpu].append(tuple(rest))
    found = [model_weather(gpu, rentals, now=now) for gpu, rentals in by_model.items()]
    shown = sorted(
        (w for w in found if w.rentals >= MIN_RENTALS), key=lambda w: (-w.rentals, w.gpu_name)
    )
    return MarketWeather(tuple(shown), hidden_models=len(found) - len(shown))


def model_weather(gpu: str, rentals: list[tuple], *, now: datetime) -> ModelWeather:
    """One model's weather from its (rented, registered, ended, host lost) rentals."""
    ready_s, decided, losses, hours = [], 0, 0, 0.0
    for rented, registered, ended, lost in rentals:
        if registered is not None:
            ready_s.append(max((registered - rented).total_seconds(), 0.0))
        decided += registered is not None or lost
        losses += lost
        hours += max(((ended or now) - rented).total_seconds(), 0.0) / 3600
    return ModelWeather(
        gpu_name=gpu,
        rentals=len(rentals),
        ready_s=tuple(sorted(ready_s)),
        decided=decided,
        ready=len(ready_s),
        losses=losses,
        rented_h=hours,
    )
