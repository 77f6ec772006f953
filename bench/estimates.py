"""Benchmark: how close is a job's pre-flight estimate to its invoice, once its shape has run?

Usage: ``python bench/estimates.py [--quick] [--seed N] [--shapes N] [--runs N] [--keep]``
(about 4 minutes for the default 6 shapes run 3 times each; ``--quick``: 3 shapes twice,
shorter jobs, about 1 minute).

Everything runs here, from scratch, as ``bench/recovery.py`` sets it up (its ``Installation``:
a throwaway SQLite database, the web process, a Celery worker thread fed by a beat thread,
the sandbox marketplace ``--fast`` on its shipped market, whose instances run the real agent
and the toy trainer). A seeded set of job *shapes* (``jobs.models.shape_of``), each a toy job
of its own speed (``TOY_STEP_SECONDS``), step count, checkpoint size (``TOY_WEIGHTS_KB``) and
interval, some fetching a "model" through the container's network first, each asking on
demand for its own GPU model and count (priced ones: the sandbox bills each item to $0.001,
which on a $0.005 job would be the whole error). Every shape is submitted ``--runs`` times,
one round after another, the shapes of a round side by side; each job is typed with
``ProfileSpec``'s defaults (4 s/step on an RTX 4090, a 60 s start, no model), as the toy
template once was, with its image's true size: the first run is a shape typed wrong.

For each job: the pre-flight estimate at submit (``billing.services.estimate_remaining_usd``,
what the budget refuses by) and, once every job finished and the sandbox's invoices are
imported (``billing.invoices.sync_team``), the invoiced cost (``billing.reconcile``). Printed,
as absolute error against the invoice, p50 and p90:

- ``first run``: the shape never ran (typed profile, the reference host at
  ``BUDGET_ESTIMATE_DPH``);
- ``later runs``: the second and later runs, estimated from what the earlier ones measured:
  the goal is p50 <= 10 %, p90 <= 25 %;
- ``bound``: the same later runs given perfect knowledge of s/step and bytes (their own run's
  speeds, downloads and checkpoints, as measured afterwards), the start-up and host still from
  history: what is left is what no history can know (the host chosen this time, contention on
  the machine, the $0.001 rounding of each invoice item, the destroy's latency);
- ``later runs, typed host``: the same estimates priced on the typed reference host instead of
  the host the shape was rented on (what learning the price paid is worth).
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.recovery import Installation, Timing, configure, wait_for  # noqa: E402
from bench.support import keep_or_remove, line, percentile  # noqa: E402

GOAL_P50, GOAL_P90 = 0.10, 0.25
IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
HEARTBEAT_S = 2
# (GPU model, count) per shape, priced from $1.6/h to $6.9/h on the shipped market; each shape
# its own, so that the shapes of a round never compete for one machine.
HOSTS = (
    ("H100 SXM", 2),
    ("RTX 4090", 4),  # $2.5/TB of traffic: the downloads show on its invoice
    ("A100 SXM4", 2),
    ("RTX 4090", 8),
    ("H100 SXM", 4),
    ("H100 SXM", 1),
    ("A100 PCIE", 4),
    ("RTX 4090", 10),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="seed of the shapes (default 1)")
    parser.add_argument("--shapes", type=int, default=6, help=f"at most {len(HOSTS)} (default 6)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each shape (default 3)")
    parser.add_argument("--quick", action="store_true", help="3 shapes, 2 runs, shorter jobs")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.runs = 3, 2
    if not 1 <= args.shapes <= len(HOSTS) or args.runs < 2:
        parser.error(f"--shapes must be 1-{len(HOSTS)} and --runs at least 2")
    return args


# ---- the shapes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    gpu: str
    gpus: int
    step_s: float
    steps: int
    every: int
    weights_kb: int
    model_bytes: int

    def command(self) -> str:
        # What makes the shape another job is on its command line (a job's env is not part of
        # its shape, jobs.models.shape_of): its speed, checkpoint size and schedule.
        knobs = (
            f"TOY_STEP_SECONDS={self.step_s} TOY_WEIGHTS_KB={self.weights_kb} "
            f"TOY_CHECKPOINT_EVERY={self.every}"
        )
        toy = f"{knobs} {shlex.quote(sys.executable)} {ROOT / 'examples' / 'toy' / 'train.py'}"
        if not self.model_bytes:
            return toy
        # The "model": fetched through the container's (metered) network before training.
        fetch = (
            "import os, shutil, urllib.request as u; url = os.environ['SANDBOX_URL'] + "
            "'/sandbox/download/' + os.environ['SANDBOX_INSTANCE_ID'] + "
            f"'?bytes={self.model_bytes}'; "
            "shutil.copyfileobj(u.urlopen(url), open(os.devnull, 'wb'), 1 << 20)"
        )
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(fetch)} && {toy}"

    def env(self) -> dict[str, str]:
        return {"TOY_STEPS": str(self.steps)}

    def describe(self) -> str:
        model = f", fetches {self.model_bytes / 1e6:.0f} MB" if self.model_bytes else ""
        return (
            f"{self.name}: {self.gpus}x {self.gpu}, {self.steps} steps of {self.step_s:.3f} s, "
            f"a {self.weights_kb} KB checkpoint every {self.every}{model}"
        )


def shapes(seed: int, count: int, quick: bool) -> list[Shape]:
    """COUNT seeded shapes, one per host of ``HOSTS``: 30-70 s of steps (15-30 s quick)."""
    rng = random.Random(seed)
    found = []
    for n, (gpu, gpus) in enumerate(HOSTS[:count]):
        step_s = round(rng.uniform(0.06, 0.3), 3)
        train_s = rng.uniform(15, 30) if quick else rng.uniform(30, 70)
        steps = max(int(train_s / step_s), 20)
        found.append(
            Shape(
                name=f"shape-{n + 1}",
                gpu=gpu,
                gpus=gpus,
                step_s=step_s,
                steps=steps,
                every=rng.choice((20, 50, 100)),
                weights_kb=rng.choice((8, 64, 256)),
                model_bytes=rng.choice((0, 0, 100_000_000, 300_000_000)),
            )
        )
    return found


# ---- the runs ----------------------------------------------------------------------------------


@dataclass
class Run:
    shape: Shape
    number: int
    job_id: int
    estimate: float
    typed_host: float
    history: object  # jobs.renting.measures.History at submit
    invoiced: float = 0.0
    bound: float = 0.0

    def error(self, value: float) -> float:
        return abs(value - self.invoiced) / self.invoiced


def submit(shape: Shape, number: int, team, user) -> Run:
    """Submit one run of SHAPE; note its pre-flight estimate and what it rested on."""
    from django.utils import timezone

    from billing.services import estimate_remaining_usd
    from jobs import lifecycle
    from jobs.renting import reference, shape_history, terms
    from sandbox.timing import image_bytes

    job = lifecycle.submit_job(
        team=team,
        created_by=user,
        now=timezone.now(),
        name=shape.name,
        image=IMAGE,
        command=shape.command(),
        env=shape.env(),
        total_steps=shape.steps,
        heartbeat_interval_s=HEARTBEAT_S,
        requirements={
            "gpu_names": [shape.gpu],
            "num_gpus": shape.gpus,
            "min_reliability": 0.98,
            "min_inet_down_mbps": 500,
            "disk_gb": 20,
            "rental": "on-demand",  # an interruptible run's outbids are interruptions
        },
        # ProfileSpec's defaults (the toy template's profile once), the image's true size.
        profile={"image_gb": image_bytes(IMAGE) / 1024**3, "model_gb": 0.0, "upload_gb": 0.01},
    )
    history = shape_history.history_for(job)
    typed_host = reference.reference_cost(
        terms.requirements_for(job),
        terms.profile_for(job, history),
        replace(history, host=None, last_decision={}),
    ).total_usd
    return Run(shape, number, job.pk, estimate_remaining_usd(job), typed_host, history)


def wait_finished(runs: list[Run], timeout: float) -> None:
    from jobs.models import Job

    def finished() -> bool:
        states = dict(
            Job.objects.filter(pk__in=[r.job_id for r in runs]).values_list("pk", "state")
        )
        bad = {pk: s for pk, s in states.items() if s in ("failed", "cancelled", "paused_budget")}
        if bad:
            raise SystemExit(f"bench: jobs ended badly: {bad}")
        return all(s == "succeeded" for s in states.values())

    wait_for(finished, timeout=timeout, what="a round of jobs to finish", every=0.5)


def settle(runs: list[Run], team) -> None:
    """Import the sandbox's invoices and note each run's invoiced cost and its bound."""
    from django.utils import timezone

    from billing import invoices, reconcile
    from jobs.models import Job

    time.sleep(2)  # the last destroys reach the sandbox
    now = timezone.now()
    invoices.sync_team(team, now=now)
    for run in runs:
        job = Job.objects.get(pk=run.job_id)
        rows = reconcile.reconcile_job(job, now=now).attempts
        if not rows or any(r.status == reconcile.Status.PENDING for r in rows):
            raise SystemExit(f"bench: job {job.pk} has no invoice yet")
        run.invoiced = sum(r.billed for r in rows)
        run.bound = bound_estimate(job, run.history)
        parts = " ".join(f"{c.name} {c.billed:.4f}" for r in rows for c in r.components)
        hosts = ", ".join(f"offer {r.attempt.offer_id} ${r.attempt.dph_base:.3f}/h" for r in rows)
        print(
            f"{run.shape.name} run {run.number}: {hosts}; estimate ${run.estimate:.4f}, "
            f"bound ${run.bound:.4f}, invoice ${run.invoiced:.4f} ({parts})",
            file=sys.stderr,
        )


def bound_estimate(job, history) -> float:
    """The pre-flight estimate had the job's own s/step and bytes been known at submit: the
    start-up and host as history had them, its speeds, downloads and checkpoints its own."""
    from jobs.renting import corrections, reference, shape_history, terms

    own = shape_history.history_of(job.team_id, "", job_id=job.pk)
    known = replace(history, speeds=own.speeds, download=own.download, checkpoints=own.checkpoints)
    typed = terms.typed_profile_for(job)
    typed = replace(typed, steps_done=0)  # as at submit
    profile = corrections.corrected_profile(typed, known)
    return reference.reference_cost(terms.requirements_for(job), profile, known).total_usd


# ---- report ------------------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{value:6.1%}"


def report(runs: list[Run], seed: int) -> None:
    first = [r for r in runs if r.number == 1]
    later = [r for r in runs if r.number > 1]
    errors = {
        "first run": [r.error(r.estimate) for r in first],
        "later runs": [r.error(r.estimate) for r in later],
        "bound (own s/step and bytes)": [r.error(r.bound) for r in later],
        "later runs, typed host": [r.error(r.typed_host) for r in later],
    }
    goal_p50 = percentile(errors["later runs"], 50) <= GOAL_P50
    goal_p90 = percentile(errors["later runs"], 90) <= GOAL_P90
    print(
        f"estimates bench: seed {seed}, {len(first)} shapes x {len(runs) // len(first)} runs; "
        f"invoiced ${min(r.invoiced for r in runs):.3f}-${max(r.invoiced for r in runs):.3f} "
        "a job; error = |pre-flight estimate - invoice| / invoice"
    )
    for name, values in errors.items():
        for stat, goal in (("p50", GOAL_P50), ("p90", GOAL_P90)):
            value = percentile(values, int(stat[1:]))
            print(line(f"{name}, {stat}", pct(value), f"goal {goal:.0%}", value / goal))
    verdict = "met" if goal_p50 and goal_p90 else "NOT met"
    print(f"goal (later runs p50 <= {GOAL_P50:.0%}, p90 <= {GOAL_P90:.0%}): {verdict}")
    if not (goal_p50 and goal_p90):
        print(f"why: {why_not(runs)}")
    worst = max(later, key=lambda r: r.error(r.estimate))
    print(
        f"worst later run: {worst.shape.name} run {worst.number}, estimate "
        f"${worst.estimate:.4f} vs invoice ${worst.invoiced:.4f} (bound ${worst.bound:.4f})"
    )


def why_not(runs: list[Run]) -> str:
    """The assumption that blocks the goal, as far as the figures tell."""
    later = [r for r in runs if r.number > 1]
    bound = percentile([r.error(r.bound) for r in later], 50)
    if bound > GOAL_P50:
        return (
            f"even with each run's own s/step and bytes the error is {bound:.0%} (p50): the "
            "host rented, its start-up and the invoice's rounding are not the history's"
        )
    return "the history's s/step or bytes differ from the run's (see the bound)"


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-estimates-bench-"))
    configure(tmp)
    installation = Installation(tmp, Timing(HEARTBEAT_S))
    try:
        installation.start()
        from django.contrib.auth import get_user_model

        from nomadgpu.models import Team

        team = Team.objects.create(name="bench", slug="bench")
        user = get_user_model().objects.create_user("bench")
        todo = shapes(args.seed, args.shapes, args.quick)
        for shape in todo:
            print(shape.describe(), file=sys.stderr)
        runs: list[Run] = []
        for number in range(1, args.runs + 1):
            batch = [submit(shape, number, team, user) for shape in todo]
            wait_finished(batch, timeout=600)
            runs.extend(batch)
            print(f"round {number}/{args.runs} finished", file=sys.stderr)
        settle(runs, team)
        report(runs, args.seed)
    finally:
        installation.stop()
        keep_or_remove(tmp, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
