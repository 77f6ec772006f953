"""Benchmark: how far past a spending limit does a job get before its machine stops billing?

Usage: ``python bench/budget.py [--destroy-latency S] [market.json]`` (Django settings only, no
database, no server; a few seconds).

The goal (issue 7) is an overshoot under one watchdog interval of spend: the baseline printed
on every line is ``WATCHDOG_INTERVAL_S`` seconds of the same job's burn. The decisions are the
real ones (``billing.enforce.must_stop`` and ``pause_deadline`` on ``LimitStatus`` values), the
clock is simulated: enforcement passes every interval at every phase offset, for every offer
of the market that passes the field report's filters (its GPU $/h plus storage of a 50 GB
disk), against a $1 limit and for checkpoint delays (``checkpoint_now`` waiting for the next
heartbeat, then the save and upload) from 5 s to past the grace. After the release, the
instance bills for ``--destroy-latency`` more seconds (a task hop and Vast's DELETE).

Figures, one line each: figure, value, baseline, ratio.
- ``steady``: worst overshoot at a constant burn (GPU and storage).
- ``jump``: the limit crossed by a traffic burst the counters report at once (15 GB pulled
  on a $0.044/GB host): what is spent AFTER the crossing is seen (the burst itself cannot be
  undone); a crossed limit is released in the pass that sees it.
- ``unused``: the most budget left unspent because the checkpoint was asked ahead (the other
  side of the trade).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")
os.environ.setdefault("FIELD_ENCRYPTION_KEY", "YmVuY2gtb25seS1rZXktYmVuY2gtb25seS1rZXktMzI=")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from billing.enforce import must_stop, pause_deadline  # noqa: E402
from billing.services import LimitStatus  # noqa: E402
from hosts.selection import Requirements, filter_offers  # noqa: E402
from hosts.vast import parse_offer  # noqa: E402

MARKETS = (ROOT / "hosts/sandbox/market/offers.json", ROOT.parent / "shared/market/offers.json")
LIMIT = 1.0
DISK_GB = 50.0
PHASES = 10
CHECKPOINT_DELAYS_S = (5.0, 30.0, 60.0, 120.0, 200.0)
T0 = datetime(2026, 11, 2, tzinfo=UTC)


def burn_rates(path: Path) -> list[tuple[int, float]]:
    """(offer id, $/h) of every offer passing the field report's filters, any GPU model."""
    raw = json.loads(path.read_text())
    offers = [parse_offer({k: v for k, v in o.items() if not k.startswith("sim_")}) for o in raw]
    kept, _ = filter_offers(offers, Requirements(disk_gb=DISK_GB))
    return [(o.id, o.dph_base + o.storage_usd_per_gb_hour * DISK_GB) for o in kept]


def status(spent: float, rate: float) -> LimitStatus:
    return LimitStatus("job", Decimal(str(LIMIT)), spent, T0, None, 1, 1, None, rate)


def release_time(rate: float, phase: float, delay: float, jump: float = 0.0) -> float:
    """Seconds from the start at which the machine stops billing (release + destroy latency).
    JUMP dollars arrive at the first pass after the limit is 90 % used."""
    step = float(settings.WATCHDOG_INTERVAL_S)
    paused_at = deadline = None
    # Nothing can happen before the look-ahead window: start a few passes ahead of it.
    horizon = float(settings.BUDGET_CHECKPOINT_GRACE_S) + 3 * step
    first = min(0.9 * LIMIT / rate * 3600, LIMIT / rate * 3600 - horizon)
    t = phase + max(first // step, 0) * step
    while True:
        spent = rate * t / 3600 + (jump if rate * t / 3600 >= 0.9 * LIMIT else 0.0)
        if paused_at is None and must_stop(status(spent, rate)):
            paused_at = t
            now = T0 + timedelta(seconds=t)
            deadline = (pause_deadline(status(spent, rate), now=now) - T0).total_seconds()
        if paused_at is not None and (t >= deadline or t >= paused_at + delay):
            return t
        t += step


def worst(rates, latency: float, jump: float = 0.0) -> tuple[float, float, float, int]:
    """(overshoot s, overshoot $, unused $, offer) worst over offers, phases and delays."""
    step = float(settings.WATCHDOG_INTERVAL_S)
    over_s = over_usd = unused = 0.0
    offer_at = 0
    for offer_id, rate in rates:
        crossing = (0.9 * LIMIT / rate * 3600) if jump else LIMIT / rate * 3600
        for k in range(PHASES):
            for delay in CHECKPOINT_DELAYS_S:
                stop = release_time(rate, step * k / PHASES, delay, jump) + latency
                late = max(stop - crossing, 0.0)
                if late * rate / 3600 > over_usd:
                    over_s, over_usd, offer_at = late, late * rate / 3600, offer_id
                if not jump:
                    unused = max(unused, LIMIT - stop * rate / 3600)
    return over_s, over_usd, unused, offer_at


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("market", nargs="?", type=Path)
    parser.add_argument("--destroy-latency", type=float, default=2.0)
    args = parser.parse_args(argv[1:])
    path = args.market or next(p for p in MARKETS if p.exists())
    rates = burn_rates(path)
    step = float(settings.WATCHDOG_INTERVAL_S)
    grace = float(settings.BUDGET_CHECKPOINT_GRACE_S)
    print(f"# {len(rates)} offers, interval {step:g} s, grace {grace:g} s, limit ${LIMIT:g}")
    for name, jump in (("steady", 0.0), ("jump", 15 * 0.0439453125)):
        over_s, over_usd, unused, offer = worst(rates, args.destroy_latency, jump)
        rate = dict(rates)[offer] if offer else max(r for _, r in rates)
        base_usd = rate * step / 3600
        print(
            f"budget/{name}: overshoot {over_s:.1f} s (${over_usd:.5f}, offer {offer}) "
            f"vs one interval {step:g} s (${base_usd:.5f}) (ratio {over_s / step:.2f})"
        )
        if name == "steady":
            top = max(r for _, r in rates)
            print(
                f"budget/unused: at most ${unused:.4f} of ${LIMIT:g} left unspent "
                f"vs grace + interval of the dearest burn (${top * (grace + step) / 3600:.4f}) "
                f"(ratio {unused / (top * (grace + step) / 3600):.2f})"
            )


if __name__ == "__main__":
    main(sys.argv)
