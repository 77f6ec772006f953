"""Benchmark: does ranking by expected total cost pick cheaper hosts than ranking by price?

Usage: ``python bench/selection.py [--quick] [market.json]`` (no Django, no server, well under a
second; ``--quick`` changes nothing).

On the seeded market (``hosts/sandbox/market/offers.json``, else ``shared/market/offers.json``)
and for two jobs, it prices three offers at their TRUE cost, i.e. the cost model of
``hosts.selection`` fed with each machine's real speed: reference s/step * the market's hidden
``sim_speed_factor`` (1.0 = a normal machine of its model). The three:

1. ``chosen``: what ``choose_offer`` picks without seeing ``sim_speed_factor`` (fresh job,
   nothing observed yet: speeds come from DLPerf);
2. ``lowest-dph``: the offer with the lowest ``dph_total`` (GPU + this job's disk) that passes
   the same filters, i.e. "rent the cheapest suitable host";
3. ``hindsight``: the offer with the lowest true cost, known only to the simulator.

Both jobs ask for one RTX 4090 (the field report's filters), because the market's ground truth
is per machine within a model; it says nothing about how other models run this workload.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402
from hosts.selection import (  # noqa: E402
    JobProfile,
    Requirements,
    SpeedBook,
    choose_offer,
    estimate_cost,
    filter_offers,
    job_dph_total,
)
from hosts.vast import Offer, parse_offer  # noqa: E402

MARKETS = (
    ROOT / "hosts" / "sandbox" / "market" / "offers.json",
    ROOT.parent / "shared" / "market" / "offers.json",
)
IMAGE_GB = 3.6e9 / 1024**3  # pytorch/pytorch, as the sandbox sizes it (hosts/sandbox/timing.py)
FIELD_REPORT = Requirements(
    gpu_names=("RTX 4090",), min_reliability=0.98, min_inet_down_mbps=500, verified_only=True
)


@dataclass(frozen=True)
class Job:
    name: str
    profile: JobProfile
    req: Requirements


JOBS = (
    Job(
        "field-report",  # QLoRA 7B: 15 GB model, 300 steps at 4 s on an RTX 4090, ~1 GB uploaded
        JobProfile(image_gb=IMAGE_GB, model_gb=15, upload_gb=1, steps_total=300),
        FIELD_REPORT,
    ),
    Job(
        "small-job",  # a 2 GB model, 60 steps: start-up and traffic weigh more than training
        JobProfile(image_gb=IMAGE_GB, model_gb=2, upload_gb=0.2, steps_total=60),
        Requirements(gpu_names=("RTX 4090",), disk_gb=20),
    ),
)


def load_market(path: Path) -> tuple[list[Offer], dict[int, float]]:
    """Offers as the sandbox serves them (no ``sim_*`` keys) and each one's true speed factor."""
    raw = json.loads(path.read_text())
    raw = raw["offers"] if isinstance(raw, dict) else raw
    offers = [parse_offer({k: v for k, v in o.items() if not k.startswith("sim_")}) for o in raw]
    factors = {int(o["id"]): float(o.get("sim_speed_factor", 1.0)) for o in raw}
    return offers, factors


def true_cost(offer: Offer, job: Job, factors: dict[int, float]) -> float:
    """The job's cost on ``offer`` at the machine's real speed."""
    real = job.profile.reference_seconds_per_step * factors[offer.id]
    truth = SpeedBook(by_machine={offer.machine_id: real})
    return estimate_cost(offer, job.profile, truth, job.req).total_usd


def figure(job: Job, offers: list[Offer], factors: dict[int, float]) -> str:
    """Two lines: the chosen offer's true cost against each baseline."""
    decision = choose_offer(offers, job.req, job.profile)
    kept, _ = filter_offers(offers, job.req)
    if decision is None or not kept:
        return f"selection/{job.name}: no offer passes the filters"
    cheapest = min(kept, key=lambda o: (job_dph_total(o, job.req.disk_gb), o.id))
    best = min(kept, key=lambda o: (true_cost(o, job, factors), o.id))
    chosen_usd, dph_usd, best_usd = (
        true_cost(o, job, factors) for o in (decision.chosen.offer, cheapest, best)
    )
    chosen = f"${chosen_usd:.3f} (offer {decision.chosen_offer_id})"
    return "\n".join(
        [
            line(
                f"selection/{job.name} vs lowest dph",
                chosen,
                f"lowest-dph ${dph_usd:.3f} (offer {cheapest.id})",
                chosen_usd / dph_usd,
            ),
            line(
                f"selection/{job.name} vs hindsight",
                chosen,
                f"hindsight ${best_usd:.3f} (offer {best.id})",
                chosen_usd / best_usd,
            ),
        ]
    )


def main(argv: list[str]) -> None:
    paths = [a for a in argv[1:] if a != "--quick"]  # already quick; `make bench` may pass it
    path = Path(paths[0]) if paths else next(p for p in MARKETS if p.exists())
    offers, factors = load_market(path)
    for job in JOBS:
        print(figure(job, offers, factors))


if __name__ == "__main__":
    main(sys.argv)
