"""Benchmark: one watchdog tick with 1k, 10k and 100k live attempts.

Usage: ``python bench/watchdog.py [--quick] [--backend postgres|sqlite|both]`` (about two
minutes for both backends; ``--quick`` stops at 10k). Postgres at ``BENCH_PG_URL`` (default
``postgres://postgres@127.0.0.1:5432``) gets a fresh ``bench_wd_<pid>`` database, dropped at the
end; SQLite a file in a temporary folder.

Each size is N running attempts (rows made with ``bulk_create``), all healthy but ``DUE`` whose
heartbeat deadline has passed: the due ones are made fresh before every timed tick, since a tick
closes them and plans their replacements. Timed: ``jobs.watchdog.passes.tick(poll_provider=False)``
with nothing due and with the due ones (the provider poll is one paged list call per account,
left out) and, separately,
``find_due_losses``; counted: their queries (``CaptureQueriesContext``). The medians of
``REPEATS`` runs are printed. The figures: queries at each size against the smallest size (the
count must not grow with healthy attempts), time growth 10k/1k and 100k/10k against linear, and
the 10k tick against the 0.5 s goal.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
DUE = 10  # due attempts at every size: what a tick does for them is the same at every size
REPEATS = 3
GOAL_10K_S = 0.5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k only")
    parser.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--profile", action="store_true", help="cProfile one tick at 1k instead")
    return parser.parse_args()


def pg_url() -> str:
    return os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432").rstrip("/")


def psql_admin(sql: str) -> None:
    subprocess.run(["psql", f"{pg_url()}/postgres", "-q", "-c", sql], check=True)


class Fleet:
    """The bench's jobs and attempts: healthy ones grown to a size, due ones made on demand."""

    def __init__(self) -> None:
        from nomadgpu.models import Team

        self.team = Team.objects.create(name="Bench", slug="bench")
        self.count = 0

    def add(self, n: int, *, due: bool) -> None:
        from datetime import timedelta

        from django.utils import timezone

        from jobs.models import Attempt, Job

        now = timezone.now()
        jobs = Job.objects.bulk_create(
            (
                Job(
                    team=self.team,
                    name=f"wd-{self.count + i}",
                    image="img",
                    command="python train.py",
                    state="running",
                )
                for i in range(n)
            ),
            batch_size=5000,
        )
        # Due: silent for longer than the heartbeat timeout (30 s at 15 s beats). Healthy: a
        # deadline far ahead, as if they kept beating while the bench builds bigger sizes.
        last_beat = now - timedelta(seconds=60) if due else now
        deadline = last_beat + timedelta(seconds=30) if due else now + timedelta(days=1)
        Attempt.objects.bulk_create(
            (
                Attempt(
                    job=job,
                    number=1,
                    state="running",
                    instance_id=10**6 + self.count + i,
                    machine_id=self.count + i,
                    label=f"ngpu:bench:{job.pk}:1",
                    registered_at=now - timedelta(hours=1),
                    running_at=now - timedelta(hours=1),
                    last_heartbeat_at=last_beat,
                    last_progress_at=last_beat,
                    heartbeat_deadline=deadline,
                    phase="running",
                    step=100,
                    gpu_ok=True,
                )
                for i, job in enumerate(jobs)
            ),
            batch_size=5000,
        )
        self.count += n


def measure(fn) -> tuple[float, int]:
    """(seconds, queries) of one call of FN."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    reset_queries()  # a full query log (9,000 entries) would make the count wrong
    with CaptureQueriesContext(connection) as captured:
        t0 = time.perf_counter()
        fn()
        spent = time.perf_counter() - t0
    return spent, len(captured.captured_queries)


def bench_size(fleet: Fleet) -> dict:
    from django.utils import timezone

    from jobs.watchdog import deadlines, passes

    def idle_tick() -> None:
        done = passes.tick(now=timezone.now(), poll_provider=False)
        assert done["lost"] == 0, f"{done['lost']} healthy attempts counted as lost"

    idle = [measure(idle_tick) for _ in range(REPEATS)]
    ticks, finds = [], []
    for _ in range(REPEATS):
        fleet.add(DUE, due=True)
        now = timezone.now()
        found = deadlines.find_due_losses(now)
        assert len(found) == DUE, f"{len(found)} due attempts found, {DUE} made"
        finds.append(measure(lambda now=now: deadlines.find_due_losses(now)))
        done: dict = {}
        ticks.append(
            measure(
                lambda now=now, done=done: done.update(passes.tick(now=now, poll_provider=False))
            )
        )
        assert done["lost"] == DUE, f"the tick handled {done['lost']} of {DUE} losses"
        assert done["planned"] == DUE, f"the tick planned {done['planned']} of {DUE} rents"
        assert not deadlines.find_due_losses(now), "the tick left due attempts behind"
    return {
        "idle_s": statistics.median(t for t, _ in idle),
        "idle_queries": max(q for _, q in idle),
        "tick_s": statistics.median(t for t, _ in ticks),
        "tick_queries": max(q for _, q in ticks),
        "find_s": statistics.median(t for t, _ in finds),
        "find_queries": max(q for _, q in finds),
    }


def profile_tick(fleet: Fleet) -> None:
    import cProfile
    import pstats

    from django.utils import timezone

    from jobs.watchdog import passes

    fleet.add(1000, due=False)
    passes.tick(now=timezone.now(), poll_provider=False)
    fleet.add(DUE, due=True)
    prof = cProfile.Profile()
    prof.runcall(passes.tick, now=timezone.now(), poll_provider=False)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


def run_backend(backend: str, sizes: tuple[int, ...], profile: bool = False) -> None:
    """Build and measure every size on BACKEND, in this process (Django set up once)."""
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-wd-bench-"))
    db = f"bench_wd_{os.getpid()}"
    url = f"{pg_url()}/{db}" if backend == "postgres" else f"sqlite:///{tmp / 'bench.sqlite3'}"
    os.environ.update(
        DJANGO_SETTINGS_MODULE="nomadgpu.settings",
        NOMADGPU_VAR_DIR=str(tmp / "var"),
        DATABASE_URL=url,
        CELERY_BROKER_URL="memory://",
        NOMADGPU_ENV="bench",
        DEBUG="0",  # production's: no query log kept outside the counted calls
        SECRET_KEY=base64.b64encode(os.urandom(40)).decode(),
        LOG_LEVEL="ERROR",
        FIELD_ENCRYPTION_KEY=base64.b64encode(os.urandom(32)).decode(),
    )
    if backend == "postgres":
        psql_admin(f"CREATE DATABASE {db}")
    try:
        import django

        django.setup()
        import logging

        logging.disable(logging.WARNING)  # every loss logs; the figures are the output
        from django.core.management import call_command
        from django.db import connection
        from django.utils import timezone

        from jobs.watchdog import passes

        call_command("migrate", verbosity=0)
        fleet = Fleet()
        if profile:
            return profile_tick(fleet)
        results = {}
        for size in sizes:
            fleet.add(size - fleet.count, due=False)
            if backend == "postgres":
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")  # autovacuum would, minutes later
            passes.tick(now=timezone.now(), poll_provider=False)  # warm
            results[size] = bench_size(fleet)
        report(backend, results)
    finally:
        from django.db import connections

        connections.close_all()
        if backend == "postgres":
            psql_admin(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)


def label(size: int) -> str:
    return f"{size // 1000}k"


def report(backend: str, results: dict) -> None:
    sizes = sorted(results)
    small = results[sizes[0]]
    print(f"watchdog bench ({backend}): {DUE} due attempts per tick, median of {REPEATS} ticks")
    for size in sizes:
        r = results[size]
        print(
            line(
                f"{backend} tick queries, {label(size)} live",
                f"{r['tick_queries']} queries",
                f"{small['tick_queries']} at {label(sizes[0])} live",
                r["tick_queries"] / small["tick_queries"],
            )
        )
        print(
            line(
                f"{backend} find_due_losses queries, {label(size)}",
                f"{r['find_queries']} queries",
                f"{small['find_queries']} at {label(sizes[0])} live",
                r["find_queries"] / small["find_queries"],
            )
        )
        print(
            line(
                f"{backend} tick queries, {label(size)}, none due",
                f"{r['idle_queries']} queries",
                f"{small['idle_queries']} at {label(sizes[0])} live",
                r["idle_queries"] / small["idle_queries"],
            )
        )
    for lo, hi in itertools.pairwise(sizes):
        for key, what in (
            ("tick_s", "tick"),
            ("idle_s", "tick, none due,"),
            ("find_s", "find_due_losses"),
        ):
            a, b = results[lo][key], results[hi][key]
            linear = a * hi / lo
            print(
                line(
                    f"{backend} {what} time {label(hi)} vs {label(lo)}",
                    f"{b * 1000:7.1f} ms (x{b / a:.1f})",
                    f"linear from {a * 1000:.1f} ms: {linear * 1000:.1f} ms",
                    b / linear,
                )
            )
    if 10_000 in results:
        t = results[10_000]["tick_s"]
        print(
            line(
                f"{backend} tick time, 10k live",
                f"{t * 1000:7.1f} ms",
                f"goal {GOAL_10K_S * 1000:.0f} ms",
                t / GOAL_10K_S,
            )
        )


def main() -> int:
    args = parse_args()
    sizes = SIZES[:2] if args.quick else SIZES
    if args.backend == "both":
        # One Django setup per process: each backend runs in a child of its own.
        for backend in ("postgres", "sqlite"):
            argv = [sys.executable, __file__, "--backend", backend]
            subprocess.run(argv + (["--quick"] if args.quick else []), check=True)
        return 0
    run_backend(args.backend, sizes, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
