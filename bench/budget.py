"""Benchmark: how far past a spending limit does a job get before its machine stops billing,
and how much of the limit does it leave unused?

Usage: ``python bench/budget.py [--quick] [--destroy-latency S] [market.json]`` (Django settings
only, no database, no server; ``--quick`` simulates 3 phase offsets instead of 10).

The goal (issue 7) is an overshoot under one watchdog interval of spend: the baseline printed
on every line is ``WATCHDOG_INTERVAL_S`` seconds of the same job's burn. The decisions are the
real ones (``billing.enforce.must_stop``, ``pause_deadline``, ``checkpoint_lead_s`` and
``pause_action`` on ``LimitStatus`` values), the clock is simulated: enforcement passes every
interval at every phase offset, for every offer of the market that passes the field report's
filters (its GPU $/h plus storage of a 50 GB disk), against a $1 limit, for checkpoints that
take 5 s to 200 s from the request to ready (the next heartbeat of a 15 s interval, the save,
the upload), each with the job's uploads measured before (a resumed job) and not (the grace
until its first checkpoint arrives). After the release, the instance bills for
``--destroy-latency`` more seconds (a task hop and Vast's DELETE).

Figures, one line each: figure, value, baseline, ratio.
- ``steady``: worst overshoot at a constant burn (GPU and storage).
- ``jump``: the limit crossed by a traffic burst the counters report at once (15 GB pulled
  on a $0.044/GB host): what is spent AFTER the crossing is seen (the burst itself cannot be
  undone); a crossed limit is released in the pass that sees it.
- ``unused``: the most budget left unspent because the checkpoint was asked ahead (the other
  side of the trade), against the grace plus an interval at the dearest burn.
- ``used``: the smallest share of the limit spent when the machine is released, for the $1
  limit and for the issue's tight $0.05 (less than a minute on the dearer hosts, shorter
  than the grace).
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

from billing.enforce import (  # noqa: E402
    ARRIVED,
    ASKED,
    RELEASE,
    checkpoint_lead_s,
    must_stop,
    pause_action,
    pause_deadline,
)
from billing.services import LimitStatus  # noqa: E402
from hosts.selection import ON_DEMAND, Requirements, filter_offers  # noqa: E402
from hosts.vast import parse_offer  # noqa: E402

MARKET = ROOT / "sandbox/market/offers.json"
LIMIT = 1.0
TIGHT_LIMIT = 0.05
DISK_GB = 50.0
PHASES = 10
CHECKPOINT_DELAYS_S = (5.0, 30.0, 60.0, 120.0, 200.0)
HEARTBEAT_S = 15.0
T0 = datetime(2026, 11, 2, tzinfo=UTC)


def burn_rates(path: Path) -> list[tuple[int, float]]:
    """(offer id, $/h) of every offer passing the field report's filters, any GPU model."""
    raw = json.loads(path.read_text())
    offers = [parse_offer({k: v for k, v in o.items() if not k.startswith("sim_")}) for o in raw]
    kept, _ = filter_offers(offers, Requirements(rental=ON_DEMAND, disk_gb=DISK_GB))
    return [(o.id, o.dph_base + o.storage_usd_per_gb_hour * DISK_GB) for o in kept]


def status(spent: float, rate: float, limit: float) -> LimitStatus:
    return LimitStatus("job", Decimal(str(limit)), spent, T0, None, 1, 1, None, rate)


def measured_lead_s(delay: float) -> float:
    """The lead a job whose checkpoints take DELAY from request to ready is given: its upload
    is what remains after a whole heartbeat interval (at least a second)."""
    upload = max(delay - HEARTBEAT_S, 1.0)
    return checkpoint_lead_s([upload], heartbeat_s=HEARTBEAT_S, seconds_per_step=0.0)


def release_time(
    rate: float, phase: float, delay: float, *, measured: bool, limit: float, jump: float = 0.0
) -> float:
    """Seconds from the attempt's start (t=0) at which the machine is released. Each checkpoint
    asked for is ready DELAY later; MEASURED: the job's uploads were measured before (else the
    grace is its lead until its first checkpoint arrives). JUMP dollars arrive at the first
    pass after the limit is 90 % used."""
    step = float(settings.WATCHDOG_INTERVAL_S)
    lead = measured_lead_s(delay)
    # Nothing can happen before the look-ahead window: start a few passes ahead of it.
    horizon = max(float(settings.BUDGET_CHECKPOINT_GRACE_S), lead) + 3 * step
    first = min(0.9 * limit / rate * 3600, limit / rate * 3600 - horizon)
    t = phase + max(first // step, 0) * step
    deadline = arrives = None
    while True:
        spent = rate * t / 3600 + (jump if rate * t / 3600 >= 0.9 * limit else 0.0)
        now = T0 + timedelta(seconds=t)
        known = measured or (arrives is not None and t >= arrives)
        lead_now = lead if known else float(settings.BUDGET_CHECKPOINT_GRACE_S)
        at = pause_deadline(status(spent, rate, limit), now=now)
        if deadline is None and must_stop(status(spent, rate, limit), lead_s=lead_now):
            deadline, arrives = at, t + delay
        elif deadline is not None:
            deadline = min(deadline, at)
            action = pause_action(
                now=now,
                started_at=T0,
                deadline=deadline,
                lead_s=lead_now,
                checkpoint=ASKED if t < arrives else ARRIVED,
            )
            if action == RELEASE:
                return t
            if action != "wait":
                arrives = t + delay
        if deadline is not None and now >= deadline:
            return t
        t += step


def worst(rates, latency: float, phases: int, limit: float, jump: float = 0.0):
    """(overshoot s, overshoot $, unused $, least share used, offer) worst over offers, phases,
    delays and whether the uploads were measured."""
    step = float(settings.WATCHDOG_INTERVAL_S)
    over_s = over_usd = unused = 0.0
    used = 1.0
    offer_at = 0
    for offer_id, rate in rates:
        crossing = (0.9 * limit / rate * 3600) if jump else limit / rate * 3600
        for k in range(phases):
            for delay in CHECKPOINT_DELAYS_S:
                for measured in (True, False):
                    released = release_time(
                        rate, step * k / phases, delay, measured=measured, limit=limit, jump=jump
                    )
                    stop = released + latency
                    late = max(stop - crossing, 0.0)
                    if late * rate / 3600 > over_usd:
                        over_s, over_usd, offer_at = late, late * rate / 3600, offer_id
                    if not jump:
                        unused = max(unused, limit - stop * rate / 3600)
                        used = min(used, released * rate / 3600 / limit)
    return over_s, over_usd, unused, used, offer_at


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("market", nargs="?", type=Path)
    parser.add_argument("--destroy-latency", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="3 phase offsets instead of 10")
    args = parser.parse_args(argv[1:])
    phases = 3 if args.quick else PHASES
    path = args.market or MARKET
    rates = burn_rates(path)
    step = float(settings.WATCHDOG_INTERVAL_S)
    grace = float(settings.BUDGET_CHECKPOINT_GRACE_S)
    print(f"# {len(rates)} offers, interval {step:g} s, grace {grace:g} s, limit ${LIMIT:g}")
    for name, jump in (("steady", 0.0), ("jump", 15 * 0.0439453125)):
        over_s, over_usd, unused, used, offer = worst(
            rates, args.destroy_latency, phases, LIMIT, jump
        )
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
            tight = worst(rates, args.destroy_latency, phases, TIGHT_LIMIT)[3]
            print(
                f"budget/used: at least {used:.0%} of ${LIMIT:g} and {tight:.0%} of "
                f"${TIGHT_LIMIT:g} spent at the release"
            )


if __name__ == "__main__":
    main(sys.argv)
