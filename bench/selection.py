"""Benchmark: does ranking by expected total cost pick cheaper hosts than ranking by price?

Usage: ``python bench/selection.py [--quick] [--seed N] [market.json]`` (no server and no
database: Django is set up only to read the stored decision as ``jobs.renting.terms`` does; a
few seconds, ``--quick`` runs fewer simulated jobs).

On the seeded market (``sandbox/market/offers.json``)
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

Then a seeded simulation of interruptible rentals (``bench/support/preemption_sim.py``, whose
docstring gives the simulated market's truth): ``SIM_JOBS`` jobs of the field report's shape
(15 GB model, 300 steps at 4 s/step on an RTX 4090, a checkpoint every 50 steps, 1 GB uploaded
in all; the image 0 or 5 GB, drawn per job) run one after another, event by event, under three
policies: ``auto`` (``Requirements(rental="auto")`` with ``rates=`` the history the simulation
has observed so far under that policy, empty at first so the prior applies; an outbid answered
as ``jobs.watchdog`` does, by ``rent_decision.RentDecision.outbid_choice``: raise the bid and
stay, or move; the outbidder holds the machine for an exponential time of the sandbox's mean,
then its min_bid falls back),
``on-demand``, and ``min-bid`` (``Requirements(rental="interruptible", bid_margins=(0.0,))``:
always at min_bid exactly, and moving when outbid, as SkyPilot and dstack bid). Printed: each
policy's mean true cost and p90 completion time (first rent to last step) against on-demand's;
goals for ``auto``: cost <= 0.7, p90 <= 1.5. Then interruptions per job (host losses and
outbids, raised or not), how many outbids ``auto`` answered by raising, and the rate ``auto``
learned for its most used bid against the truth. Last, the bound: the same jobs on the same
truth with no outbid ever, i.e. what bidding at the market's min_bids could save at best (the
goal is out of reach when this bound is near it: traffic and storage are not discounted).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")
os.environ.setdefault("FIELD_ENCRYPTION_KEY", "YmVuY2gtb25seS1rZXktYmVuY2gtb25seS1rZXktMzI=")

import django  # noqa: E402

django.setup()  # the outbid answer reads the stored decision through jobs.rent_decision

from bench.support import line  # noqa: E402
from bench.support.preemption_sim import AUTO, MIN_BID, ON_DEMAND, simulate  # noqa: E402
from hosts.selection import (  # noqa: E402
    INTERRUPTIBLE,
    JobProfile,
    Requirements,
    SpeedBook,
    choose_offer,
    estimate_cost,
    filter_offers,
    job_dph_total,
)
from hosts.vast import Offer, parse_offer  # noqa: E402

MARKET = ROOT / "sandbox" / "market" / "offers.json"
IMAGE_GB = 3.6e9 / 1024**3  # pytorch/pytorch, as the sandbox sizes it (sandbox/timing.py)
FIELD_REPORT = Requirements(
    rental=ON_DEMAND,
    gpu_names=("RTX 4090",),
    min_reliability=0.98,
    min_inet_down_mbps=500,
    verified_only=True,
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
        Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=20),
    ),
)


SIM_JOBS, SIM_JOBS_QUICK, SIM_SEED = 400, 100, 20250207
SIM_PROFILES = tuple(
    JobProfile(
        image_gb=image_gb,
        model_gb=15,
        upload_gb=1,
        steps_total=300,
        checkpoint_every_steps=50,
        checkpoint_gb=1 / 6,  # one of the six checkpoints the 1 GB of uploads is made of
    )
    for image_gb in (0.0, 5.0)
)
GOAL_COST, GOAL_P90 = 0.7, 1.5


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


def simulation(offers: list[Offer], factors: dict[int, float], n_jobs: int, seed: int) -> str:
    """The interruptible-rental lines (module docstring)."""
    truth, runs = simulate(offers, factors, FIELD_REPORT, SIM_PROFILES, n_jobs=n_jobs, seed=seed)
    base = runs[ON_DEMAND]
    base_usd, base_p90 = base.mean_usd, base.wall_p(90)
    lines = []
    for policy, goal in ((AUTO, True), (MIN_BID, False)):
        run = runs[policy]
        usd, p90 = run.mean_usd, run.wall_p(90)
        cost_goal = f", goal <={GOAL_COST}" if goal else ""
        time_goal = f", goal <={GOAL_P90}" if goal else ""
        lines += [
            line(
                f"selection/sim {policy} mean cost{cost_goal}",
                f"${usd:.3f} ({n_jobs} jobs)",
                f"on-demand ${base_usd:.3f}",
                usd / base_usd,
            ),
            line(
                f"selection/sim {policy} p90 time{time_goal}",
                f"{p90:.3f} h (p50 {run.wall_p(50):.3f})",
                f"on-demand {base_p90:.3f} h (p50 {base.wall_p(50):.3f})",
                p90 / base_p90,
            ),
        ]
    auto, min_bid = runs[AUTO], runs[MIN_BID]
    lines.append(
        line(
            "selection/sim auto interruptions per job",
            f"{auto.interruptions_per_job:.2f} ({auto.interruptible_share:.0%} bids)",
            f"min-bid {min_bid.interruptions_per_job:.2f}",
            auto.interruptions_per_job / max(min_bid.interruptions_per_job, 1e-9),
        )
    )
    lines.append(
        line(
            "selection/sim auto outbids raised / moved",
            f"{auto.raised} raised / {auto.outbids - auto.raised} moved",
            f"min-bid 0 raised / {min_bid.outbids} moved",
            auto.raised / max(auto.outbids, 1),
        )
    )
    bids = {k: v for k, v in auto.history.seen.items() if k[0] == INTERRUPTIBLE}
    if bids:
        key = max(bids, key=lambda k: bids[k][1])
        learned, _ = auto.history.rates().rate(*key)
        true = auto.history.true_exposure[key] / bids[key][1]
        lines.append(
            line(
                f"selection/sim learned rate {key[1]} +{key[2]:.0%}",
                f"{learned:.2f}/h ({bids[key][0]} in {bids[key][1]:.0f} h)",
                f"truth {true:.2f}/h (model {truth.model_outbid_per_h[key[1]]:.2f} at min)",
                learned / true,
            )
        )
    _, calm = simulate(
        offers, factors, FIELD_REPORT, SIM_PROFILES, n_jobs=n_jobs, seed=seed, outbids=False
    )
    lines.append(
        line(
            "selection/sim bound: auto if never outbid",
            f"${calm[AUTO].mean_usd:.3f} (no outbid at all)",
            f"on-demand ${calm[ON_DEMAND].mean_usd:.3f}",
            calm[AUTO].mean_usd / calm[ON_DEMAND].mean_usd,
        )
    )
    unfinished = sum(r.unfinished for r in runs.values())
    if unfinished:
        lines.append(f"selection/sim: {unfinished} jobs did not finish in the attempts allowed")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args, seed = list(argv[1:]), SIM_SEED
    if "--seed" in args:
        at = args.index("--seed")
        seed = int(args[at + 1])
        del args[at : at + 2]
    quick = "--quick" in args
    paths = [a for a in args if a != "--quick"]
    path = Path(paths[0]) if paths else MARKET
    offers, factors = load_market(path)
    for job in JOBS:
        print(figure(job, offers, factors))
    print(simulation(offers, factors, SIM_JOBS_QUICK if quick else SIM_JOBS, seed))


if __name__ == "__main__":
    main(sys.argv)
