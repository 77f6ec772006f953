"""Benchmark: the Young/Daly checkpoint interval against a fixed one, on flaky and stable hosts.

Usage: ``python bench/checkpoint_interval.py [--quick] [--seed N]`` (no Django, no server; a
few seconds, ``--quick`` simulates fewer jobs).

A seeded simulation of jobs of the field report's shape: 300 steps of 4 s (20 min of
training), a 1 GB checkpoint. Two policies run on the same hosts and the same failures
(common random numbers):

- ``fixed-50``: the script checkpoints every 50 steps (the field report's script);
- ``young-daly``: the job says ``checkpoint = "auto"`` and its script saves only when asked;
  the supervisor asks after the newest ready checkpoint (or the start) with the product's own
  rule and estimates (``jobs.checkpoints.interval``, as ``jobs.checkpoints.requests.interval_for``
  calls it): λ from the team's history and the machine's record blended with
  ``hosts.selection.prior_rate``; δ the median of the uploads on this host, before the first
  the job's declared 1 GB over the host's advertised upload speed; the training left after
  the newest durable checkpoint split into equal intervals of about √(2·δ·MTBF)
  (``split_remaining``; none when the end comes sooner than a checkpoint pays). The speed and
  step count are taken as known from the start (the first heartbeat reports them within
  seconds; the first request is a minute away at the soonest). A request reaches the script on
  the next heartbeat (15 s) after the next watchdog tick (5 s); it saves at the end of its
  step.

Truth (not the prior): δ = 1 GB at a host's upload speed, drawn from the sandbox market's
``inet_up`` (``sandbox/market/offers.json``; median ~630 Mbit/s, so δ median ~15 s),
+ 2 s to announce and verify, each upload times U(0.8, 1.25). MTBF per host log-uniform:

- flaky: interruptible rentals, 0.5-2 h (outbids, plus host loss at 0.02/h). The supervisor
  knows the team's 100 h of interruptible history on the GPU (interruptions drawn from the
  mix's mean rate) and the machine's host-loss record (0-200 h);
- stable: on-demand, 50-500 h. The team has 500 h of on-demand history, the machine 0-200 h.

Printed: overhead per job, its two parts, lost work per interruption and the interval used
(the median of those asked; "none before the end" is left out), young-daly against fixed-50;
goals: flaky total ≤ 0.70 of fixed, stable ≤ 1.00. For each mix, **perfect knowledge**: the
same rule fed each host's true mean δ and true MTBF, which no supervisor can know (a reference,
not a lower bound: the gap to it is what better estimates could still win). The advertised
upload speed is the truth's own here, so the estimate before the first upload is right but for
the upload's noise; the flaky mix is run again with each host's real uplink a U(0.3, 1.0) share
of what it advertised (the estimate is then optimistic until the host's first upload is
measured). Then the flaky mix by host upload speed (δ), where the answer changes.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402
from hosts.selection import INTERRUPTIBLE, ON_DEMAND, PreemptionRates  # noqa: E402
from jobs.checkpoints import interval as ci  # noqa: E402

SEED = 1
JOBS = {"flaky": 4000, "stable": 20000}
JOBS_QUICK = {"flaky": 800, "stable": 4000}
STEPS, STEP_S, FIXED_EVERY = 300, 4.0, 50
WORK_S = STEPS * STEP_S
CHECKPOINT_MBIT = 8000.0  # 1 GB
CHECKPOINT_BYTES = CHECKPOINT_MBIT * 1e6 / 8  # the job's declared size (``checkpoint_gb``)
UPLOAD_FIXED_S = 2.0
UPLOAD_NOISE = (0.8, 1.25)  # each upload takes the host's δ times U(these)
HEARTBEAT_S, TICK_S = 15.0, 5.0
GPU = "RTX 4090"
HOST_LOSS_PER_H = 0.02
MACHINE_HISTORY_H = 200.0
MARKET = ROOT / "sandbox" / "market" / "offers.json"


@dataclass(frozen=True)
class Mix:
    name: str
    kind: str
    mtbf_h: tuple[float, float]
    team_hours: float


MIXES = {
    "flaky": Mix("flaky", INTERRUPTIBLE, (0.5, 2.0), 100.0),
    "stable": Mix("stable", ON_DEMAND, (50.0, 500.0), 500.0),
}


@dataclass(frozen=True)
class Host:
    ttf_s: float  # training seconds until it fails
    delta_s: float  # its true upload time
    machine_losses: int
    machine_hours: float
    upload_mbps: float  # what its offer advertised
    mtbf_s: float  # its true MTBF (only the oracle sees it)


@dataclass
class Run:
    wall_s: float = 0.0
    stall_s: float = 0.0
    checkpoints: int = 0
    interruptions: int = 0
    intervals: list[float] = field(default_factory=list)

    @property
    def lost_s(self) -> float:
        return self.wall_s - WORK_S - self.stall_s

    @property
    def overhead_s(self) -> float:
        return self.wall_s - WORK_S


def poisson(rng: random.Random, mean: float) -> int:
    """Events of a Poisson process of MEAN (exponential gaps; means here are small)."""
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n, t = n + 1, t + rng.expovariate(1.0)
    return n


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def mean_rate(mix: Mix) -> float:
    """The mix's mean failures per hour (of a log-uniform MTBF)."""
    low, high = mix.mtbf_h
    return (1 / low - 1 / high) / math.log(high / low)


def team_rates(mix: Mix, seed: int) -> PreemptionRates:
    """The team's history: TEAM_HOURS rented hours of the mix's kind on the GPU."""
    rng = random.Random(f"team-{seed}-{mix.name}")
    seen = poisson(rng, mean_rate(mix) * mix.team_hours)
    observed = {(mix.kind, GPU, 0.0): (seen, mix.team_hours)}
    if mix.kind != ON_DEMAND:  # the host-loss share comes from on-demand history
        observed[(ON_DEMAND, GPU, 0.0)] = (poisson(rng, HOST_LOSS_PER_H * 100), 100.0)
    return PreemptionRates(observed)


def draw_host(
    mix: Mix, uploads_mbps: list[float], seed: int, job: int, k: int, *, uplink_share=(1.0, 1.0)
) -> Host:
    """Attempt K's host of JOB: the same for both policies. Its real uplink is a
    U(UPLINK_SHARE) share of what it advertised (1: all of it)."""
    rng = random.Random(f"host-{seed}-{mix.name}-{job}-{k}")
    mtbf_h = log_uniform(rng, *mix.mtbf_h)
    host_loss = HOST_LOSS_PER_H if mix.kind != ON_DEMAND else 1 / mtbf_h
    hours = rng.uniform(0, MACHINE_HISTORY_H)
    advertised = rng.choice(uploads_mbps)
    share = rng.uniform(*uplink_share)
    return Host(
        ttf_s=rng.expovariate(1 / (mtbf_h * 3600)),
        delta_s=CHECKPOINT_MBIT / (advertised * share) + UPLOAD_FIXED_S,
        machine_losses=poisson(rng, host_loss * hours),
        machine_hours=hours,
        upload_mbps=advertised,
        mtbf_s=mtbf_h * 3600,
    )


def interval_s(
    mix: Mix,
    rates: PreemptionRates,
    host: Host,
    here: list[float],
    before: list[float],
    remaining_s: float,
) -> float:
    """What the supervisor would choose for HOST, as ``jobs.checkpoints.requests.interval_for``:
    HERE and BEFORE are the job's uploads on this host and on its earlier ones, REMAINING_S the
    training left after the newest durable checkpoint."""
    rental, source = rates.rate(mix.kind, GPU)
    host_rate, _ = rates.rate(ON_DEMAND, GPU)
    rate, source = ci.failure_rate_per_h(
        rental_rate_per_h=rental,
        rental_source=source,
        host_loss_per_h=host_rate,
        machine_interruptions=host.machine_losses,
        machine_hours=host.machine_hours,
    )
    delta, delta_source = ci.checkpoint_cost_s(
        this_host_s=here[-5:],
        size_bytes=CHECKPOINT_BYTES,
        upload_mbps=host.upload_mbps,
        elsewhere_s=before[-5:],
    )
    choice = ci.choose_interval(
        rate_per_h=rate,
        rate_source=source,
        delta_s=delta,
        delta_source=delta_source,
        heartbeat_s=HEARTBEAT_S,
        remaining_s=remaining_s,
    )
    return choice.interval_s


def oracle_interval_s(host: Host, remaining_s: float) -> float:
    """Perfect knowledge: the same rule on the host's TRUE mean δ and MTBF, which no supervisor
    knows."""
    mean_delta = host.delta_s * statistics.fmean(UPLOAD_NOISE)
    pieces = ci.split_remaining(remaining_s, delta_s=mean_delta, mtbf_s=host.mtbf_s)
    return remaining_s / pieces if pieces > 1 else math.inf


def next_save(policy: str, progress: float, since_ready: float, tau: float, rng) -> float:
    """The training progress (seconds) at which the next checkpoint is saved."""
    if policy == FIXED:
        every = FIXED_EVERY * STEP_S
        return (math.floor(progress / every + 1e-9) + 1) * every
    if math.isinf(tau):
        return WORK_S  # no checkpoint pays before the end: the job's own end saves
    # Asked at the first tick after tau, delivered by the next heartbeat, saved at step end.
    delay = max(tau - since_ready, 0.0) + rng.uniform(0, TICK_S) + rng.uniform(0, HEARTBEAT_S)
    return math.ceil((progress + delay) / STEP_S - 1e-9) * STEP_S


def run_job(
    policy: str,
    mix: Mix,
    rates: PreemptionRates,
    markets,
    seed: int,
    job: int,
    uplink_share=(1.0, 1.0),
) -> Run:
    """One job to its last step under POLICY; hosts and failures as for the other policy."""
    rng = random.Random(f"delay-{seed}-{mix.name}-{policy}-{job}")
    run, durable, before, k = Run(), 0.0, [], 0
    while True:
        host = draw_host(mix, markets, seed, job, k, uplink_share=uplink_share)
        t, progress, since_ready = 0.0, durable, 0.0  # wall on this host, progress, since ready
        here: list[float] = []
        while True:
            tau = 0.0
            if policy == YOUNG_DALY:
                tau = interval_s(mix, rates, host, here, before, WORK_S - progress)
            elif policy == ORACLE:
                tau = oracle_interval_s(host, WORK_S - progress)
            if policy != FIXED:
                run.intervals.append(tau)
            save_at = min(next_save(policy, progress, since_ready, tau, rng), WORK_S)
            t_save = t + save_at - progress
            if t_save > host.ttf_s:
                break  # lost while training
            if save_at >= WORK_S:
                run.wall_s += t_save
                return run
            delta = host.delta_s * rng.uniform(*UPLOAD_NOISE)
            run.checkpoints += 1
            if t_save + delta > host.ttf_s:
                run.stall_s += host.ttf_s - t_save
                t = host.ttf_s
                break  # lost during the upload: not durable
            run.stall_s += delta
            here.append(delta)
            t, progress, durable, since_ready = t_save + delta, save_at, save_at, 0.0
        run.wall_s += host.ttf_s
        run.interruptions += 1
        before += here
        k += 1


@dataclass(frozen=True)
class Summary:
    overhead_s: float
    stall_s: float
    lost_s: float
    checkpoints: float
    lost_per_interruption_s: float
    interruptions: int
    interval_s: float


def summarise(runs: list[Run]) -> Summary:
    interruptions = sum(r.interruptions for r in runs)
    lost = sum(r.lost_s for r in runs)
    intervals = [i for r in runs for i in r.intervals if math.isfinite(i)]
    return Summary(
        overhead_s=statistics.fmean(r.overhead_s for r in runs),
        stall_s=statistics.fmean(r.stall_s for r in runs),
        lost_s=statistics.fmean(r.lost_s for r in runs),
        checkpoints=statistics.fmean(r.checkpoints for r in runs),
        lost_per_interruption_s=lost / interruptions if interruptions else 0.0,
        interruptions=interruptions,
        interval_s=statistics.median(intervals) if intervals else FIXED_EVERY * STEP_S,
    )


def ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == 0 else math.inf)


def compare(name: str, yd: Summary, fixed: Summary, goal: float) -> list[str]:
    met = "met" if ratio(yd.overhead_s, fixed.overhead_s) <= goal else "NOT met"
    return [
        overhead_line(
            f"{name} overhead per job (goal ≤{goal:.2f})",
            yd,
            fixed,
            f"{yd.overhead_s:.1f} s ({met})",
        ),
        line(
            f"ckpt/{name} checkpoint stall per job",
            f"{yd.stall_s:.1f} s ({yd.checkpoints:.2f} ckpt)",
            f"fixed-50 {fixed.stall_s:.1f} s ({fixed.checkpoints:.2f} ckpt)",
            ratio(yd.stall_s, fixed.stall_s),
        ),
        line(
            f"ckpt/{name} work lost per job",
            f"{yd.lost_s:.1f} s",
            f"fixed-50 {fixed.lost_s:.1f} s",
            ratio(yd.lost_s, fixed.lost_s),
        ),
        line(
            f"ckpt/{name} lost per interruption",
            f"{yd.lost_per_interruption_s:.0f} s ({yd.interruptions} int.)",
            f"fixed-50 {fixed.lost_per_interruption_s:.0f} s ({fixed.interruptions} int.)",
            ratio(yd.lost_per_interruption_s, fixed.lost_per_interruption_s),
        ),
        line(
            f"ckpt/{name} interval (median)",
            f"{yd.interval_s:.0f} s",
            f"fixed-50 {FIXED_EVERY * STEP_S:.0f} s",
            ratio(yd.interval_s, FIXED_EVERY * STEP_S),
        ),
    ]


def run_policies(
    policies, mix: Mix, rates, markets, seed: int, jobs: int, uplink_share=(1.0, 1.0)
) -> dict[str, Summary]:
    """JOBS jobs of MIX under each of POLICIES, on the same hosts and failures, summarised."""
    return {
        p: summarise([run_job(p, mix, rates, markets, seed, j, uplink_share) for j in range(jobs)])
        for p in policies
    }


def overhead_line(figure: str, ours: Summary, fixed: Summary, value: str = "") -> str:
    """One figure: OURS's overhead per job against fixed-50's."""
    return line(
        f"ckpt/{figure}",
        value or f"{ours.overhead_s:.1f} s",
        f"fixed-50 {fixed.overhead_s:.1f} s",
        ratio(ours.overhead_s, fixed.overhead_s),
    )


def by_delta(mix: Mix, rates, markets, seed: int, jobs: int) -> list[str]:
    """The flaky mix again, hosts split by upload speed (δ of 1 GB)."""
    lines = []
    for low, high in ((0.0, 10.0), (10.0, 30.0), (30.0, math.inf)):
        speeds = [m for m in markets if low <= CHECKPOINT_MBIT / m + UPLOAD_FIXED_S < high]
        if not speeds:
            continue
        runs = run_policies(BOTH, mix, rates, speeds, seed, jobs)
        band = f"δ {low:.0f}-{high:.0f} s" if math.isfinite(high) else f"δ ≥{low:.0f} s"
        figure = f"{mix.name} overhead, {band} ({len(speeds)} hosts)"
        lines.append(overhead_line(figure, runs[YOUNG_DALY], runs[FIXED]))
    return lines


YOUNG_DALY, FIXED, ORACLE = "young-daly", "fixed-50", "oracle"
BOTH = (YOUNG_DALY, FIXED)
# Real uplinks to object storage against what hosts advertise, for the sensitivity line: the
# market's inet_up is Vast's own speed test, which a bucket elsewhere need not match.
SLOW_UPLINK_SHARE = (0.3, 1.0)


def upload_speeds() -> list[float]:
    """Every market offer's advertised upload speed, Mbit/s."""
    offers = json.loads(MARKET.read_text())
    return [float(o["inet_up"]) for o in offers if o.get("inet_up")]


def extra_lines(name: str, mix: Mix, rates, markets, seed: int, jobs: int, runs) -> list[str]:
    """Perfect knowledge (the same rule on each host's true δ and MTBF) and, for the flaky mix, the
    same comparison with real uplinks slower than advertised."""
    oracle = runs[ORACLE]
    value = f"{oracle.overhead_s:.1f} s ({oracle.checkpoints:.2f} ckpt)"
    lines = [overhead_line(f"{name} with perfect knowledge of δ, MTBF", oracle, runs[FIXED], value)]
    if mix.kind == ON_DEMAND:
        return lines
    lo, hi = SLOW_UPLINK_SHARE
    slow = run_policies(BOTH, mix, rates, markets, seed, jobs, SLOW_UPLINK_SHARE)
    figure = f"{name} overhead, uplinks {lo:.0%}-{hi:.0%} of advertised"
    lines.append(overhead_line(figure, slow[YOUNG_DALY], slow[FIXED]))
    return lines


def main(argv: list[str]) -> None:
    args, seed = list(argv[1:]), SEED
    if "--seed" in args:
        seed = int(args[args.index("--seed") + 1])
    jobs = JOBS_QUICK if "--quick" in args else JOBS
    markets = upload_speeds()
    goals = {"flaky": 0.70, "stable": 1.00}
    for name, mix in MIXES.items():
        rates = team_rates(mix, seed)
        runs = run_policies((*BOTH, ORACLE), mix, rates, markets, seed, jobs[name])
        print("\n".join(compare(name, runs[YOUNG_DALY], runs[FIXED], goals[name])))
        print("\n".join(extra_lines(name, mix, rates, markets, seed, jobs[name], runs)))
    flaky = MIXES["flaky"]
    print("\n".join(by_delta(flaky, team_rates(flaky, seed), markets, seed, jobs["flaky"] // 2)))


if __name__ == "__main__":
    main(sys.argv)
