"""Benchmark: what the team's memory of machines adds to a planted bad machine's expected cost,
and how the ranking changes, on the bundled market (no server, no database; under a second).

Usage: ``python bench/machine_memory.py [--quick] [market.json]``.

For two jobs that ask for one RTX 4090 at the field report's filters (the field report's QLoRA:
a 3.6 GB image, 15 GB of model, 300 steps at 4 s/step; and a 20-hour run of the same shape),
the planted machine is the one ``choose_offer`` rents with an empty memory (every start priced
on its prior from reliability). Then the memory holds, for that machine: one incident (lost
while loading, a day ago), two (the second today: 2 in 7 days, so it is set aside), and one loss
while running after 0.3 h ready. Printed for each: the planted offer's expected total, what its
record adds (``selection.MemoryNote.usd``), its rank, and the offer rented, against the empty
memory (ratio: its total with the record over its total without).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402
from hosts.selection import (  # noqa: E402
    ON_DEMAND,
    JobProfile,
    Requirements,
    choose_offer,
)
from hosts.selection import machine_memory as mm  # noqa: E402
from hosts.vast import parse_offer  # noqa: E402

MARKET = ROOT / "sandbox" / "market" / "offers.json"
NOW = datetime(2026, 12, 1, tzinfo=UTC)
IMAGE_GB = 3.6e9 / 1024**3  # pytorch/pytorch, as the sandbox sizes it (sandbox/timing.py)
REQ = Requirements(
    rental=ON_DEMAND, gpu_names=("RTX 4090",), min_reliability=0.98, min_inet_down_mbps=500
)
JOBS = {
    "field-report": JobProfile(
        image_gb=IMAGE_GB, model_gb=15, upload_gb=1, steps_total=300, checkpoint_every_steps=50
    ),
    "20-hour run": JobProfile(
        image_gb=IMAGE_GB, model_gb=15, upload_gb=1, steps_total=18000, checkpoint_every_steps=900
    ),
}


def rental(days_ago: float, incident: str, running_h: float = 0.0) -> mm.RentalRecord:
    end = NOW - timedelta(days=days_ago)
    ready = incident not in mm.START_FAILURES
    return mm.RentalRecord(end - timedelta(hours=1), end, ready, running_h, incident=incident)


CASES = {
    "1 incident (lost while loading)": [rental(1, mm.LOST_LOADING)],
    "2 incidents in 7 days": [rental(1, mm.LOST_LOADING), rental(0, mm.NEVER_READY)],
    "1 loss while running (0.3 h ready)": [rental(1, mm.LOST_RUNNING, 0.3)],
}


def load(path: Path):
    raw = json.loads(path.read_text())
    return [parse_offer({k: v for k, v in o.items() if not k.startswith("sim_")}) for o in raw]


def main(argv: list[str]) -> None:
    paths = [a for a in argv if not a.startswith("--")]
    offers = load(Path(paths[0]) if paths else MARKET)
    for name, profile in JOBS.items():
        empty = choose_offer(offers, REQ, profile, memory=mm.NO_MEMORY, top_n=len(offers))
        planted = empty.chosen.offer
        before = empty.chosen.expected_total_usd
        runner_up = empty.candidates[1]
        print(
            f"{name}: planted machine {planted.machine_id} (offer {planted.id}, "
            f"${planted.dph_base:.3f}/h, reliability {planted.reliability}): "
            f"${before:.4f} with no record; runner-up machine {runner_up.offer.machine_id} "
            f"${runner_up.expected_total_usd:.4f}"
        )
        for case, rentals in CASES.items():
            memory = mm.MachineMemory(
                {planted.machine_id: mm.remember(planted.machine_id, rentals, NOW)}
            )
            decision = choose_offer(offers, REQ, profile, memory=memory, top_n=len(offers))
            print(describe(name, case, decision, planted, before))


def describe(name, case, decision, planted, before) -> str:
    ranked = [c.offer.machine_id for c in decision.candidates]
    chosen = decision.chosen
    if planted.machine_id not in ranked:
        value = f"set aside; rents {chosen.offer.machine_id}"
        return line(
            f"{name}: {case}",
            value,
            f"${before:.4f} rank 1",
            chosen.expected_total_usd / before,
        )
    rank = ranked.index(planted.machine_id) + 1
    mine = decision.candidates[rank - 1]
    usd = mine.memory.usd
    value = (
        f"${mine.expected_total_usd:.4f} ({'+' if usd >= 0 else '-'}${abs(usd):.4f}) rank {rank}"
    )
    return line(f"{name}: {case}", value, f"${before:.4f} rank 1", mine.expected_total_usd / before)


if __name__ == "__main__":
    main(sys.argv[1:])
