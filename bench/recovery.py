"""Benchmark: how fast does a job get back to training after its host is lost?

Usage: ``python bench/recovery.py [--drills N] [--quick] [--heartbeat-s S] [--keep]`` (about a
minute for the default 5 drills of each kind, then 3-4 min for the field-report part's 2 per
configuration; ``--quick`` runs 2, and 1 of the field report's: about 90 s in all on 2 cores).

Everything runs here, from scratch, in a temporary folder: a throwaway SQLite database
(migrated), the web process (Django's threaded WSGI server: agent API and local object
storage), a Celery worker thread (solo pool, in-memory broker) fed by a beat thread sending
watchdog ticks, and the sandbox marketplace (``--fast --relaxed-rate-limits``) whose instances
run the real agent and the toy trainer. One toy job trains for good; the drills break its host
again and again:

- destroy drills: the host vanishes (sandbox ``destroy``); timed are detection, re-rent and
  running again;
- freeze drills: silent network loss (sandbox ``freeze``: the provider still says running),
  which only the heartbeat timeout can notice.

Time scale. Production beats every 15 s, polls the provider every 10 s and ticks the watchdog
every 5 s; that would make a drill last minutes. Here all three are divided by the same factor
(15 s / ``--heartbeat-s``, default 1 s: factor 15, so the poll is 0.67 s and the tick 0.33 s), so
detection figures keep their proportions and are printed in heartbeat intervals ("hb") and in
production seconds. Rate limits are relaxed because they are real-time seconds and would not
scale. Re-rent and running-again depend on the sandbox's own --fast phases (an image pull takes
under a second instead of minutes), so their baselines are measured in the same run: the job's
first rent and first start.

Each figure is one line: median or p90, a baseline, and the ratio of the two.

Then the field-report part (issue 30), in its own process (a second installation, the sandbox at
a uniform time scale): ``bench/support/field_report.py``, whose docstring says how it runs; its
figures are per-phase medians in production seconds over a ladder of configurations (baseline,
then overlap, staged bf16 weights, staged 4-bit weights, a machine that holds the image: each
adding one measure), each measure's phase before and after it, a rebooted host waited for
beside a destroy, every measure on against the goals, the bounds, what each costs, and the
standby's keep rule. ``--no-field-report`` skips it.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import keep_or_remove, line  # noqa: E402

PRODUCTION_HEARTBEAT_S = 15.0  # the job's default heartbeat interval
PRODUCTION_POLL_S = 10.0  # PROVIDER_POLL_INTERVAL_S
PRODUCTION_TICK_S = 5.0  # WATCHDOG_INTERVAL_S
DETECTION_GOAL_S = 15.0  # a destroyed host, confirmed by the provider, within 15 s
TOY_STEP_S = 0.05
CHECKPOINT_EVERY = 20
FIELD_REPORT_REQUIREMENTS = {  # on demand, as the field report rented (JobSpec's default bids)
    "gpu_names": ["RTX 4090"],
    "min_reliability": 0.98,
    "min_inet_down_mbps": 500,
    "disk_gb": 20,
    "rental": "on-demand",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drills", type=int, default=5, help="drills of each kind (default 5)")
    parser.add_argument(
        "--heartbeat-s",
        type=int,
        default=1,
        help="heartbeat interval in seconds; poll and tick scale with it (default 1)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--quick", action="store_true", help="2 drills of each kind")
    parser.add_argument(
        "--no-field-report", action="store_true", help="skip the field-report part (issue 30)"
    )
    args = parser.parse_args()
    if args.quick:
        args.drills = 2
    if args.drills < 1 or args.heartbeat_s < 1:
        parser.error("--drills and --heartbeat-s must be at least 1")
    return args


def configure(tmp: Path) -> None:
    """Environment for a throwaway installation under TMP, set before Django reads it."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="nomadgpu.settings",
        NOMADGPU_VAR_DIR=str(tmp / "var"),
        DATABASE_URL=f"sqlite:///{tmp / 'bench.sqlite3'}",
        CELERY_BROKER_URL="memory://",
        STORAGE_BACKEND="local",
        STORAGE_LOCAL_DIR=str(tmp / "objects"),
        NOMADGPU_ENV="bench",
    )
    # Team secrets are sealed with this key; a run's database is thrown away with it.
    os.environ["FIELD_ENCRYPTION_KEY"] = base64.b64encode(os.urandom(32)).decode()


# ---- the installation ------------------------------------------------------------------------


@dataclass
class Timing:
    heartbeat_s: int

    @property
    def scale(self) -> float:
        return PRODUCTION_HEARTBEAT_S / self.heartbeat_s

    @property
    def poll_s(self) -> float:
        return PRODUCTION_POLL_S / self.scale

    @property
    def tick_s(self) -> float:
        return PRODUCTION_TICK_S / self.scale


class Installation:
    """Web server, worker, beat and sandbox, started in that order and stopped in reverse."""

    def __init__(
        self,
        tmp: Path,
        timing: Timing,
        sandbox_flags: tuple[str, ...] = ("--fast", "--relaxed-rate-limits"),
    ) -> None:
        self.tmp, self.timing, self.sandbox_flags = tmp, timing, sandbox_flags
        self.stop_beat = threading.Event()
        self.server = self.worker_cm = self.sandbox = None

    def start(self) -> None:
        import django

        django.setup()
        # The project logs every provider call and task at INFO; the figures are the output.
        logging.disable(logging.INFO)
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)  # "no hostname": memory://
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.start_web()
        self.start_sandbox()
        settings.VAST_URL = self.sandbox.url
        settings.VAST_API_KEY = "sandbox-key"
        settings.PROVIDER_POLL_INTERVAL_S = self.timing.poll_s
        from jobs.bootstrap import agent_zipapp_path

        agent_zipapp_path()  # built now, not inside the first rent it would slow down
        self.start_worker()
        threading.Thread(target=self.beat, daemon=True).start()

    def start_web(self) -> None:
        from django.conf import settings
        from django.core.handlers.wsgi import WSGIHandler
        from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

        class Quiet(WSGIRequestHandler):
            def log_message(self, format, *args) -> None:
                pass

        self.server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet, allow_reuse_address=True)
        self.server.set_app(WSGIHandler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        settings.SITE_URL = f"http://127.0.0.1:{self.server.server_port}"

    def start_sandbox(self) -> None:
        from tests.support.sandbox import DEFAULT_KEY, Sandbox

        self.sandbox = Sandbox(self.tmp / "sandbox", self.sandbox_flags, (DEFAULT_KEY,)).start()

    def start_worker(self) -> None:
        from celery.contrib.testing.worker import start_worker

        from nomadgpu.celery import app

        # The in-memory transport polls its queue; once a second would add up to 1 s per hop.
        app.conf.broker_transport_options = {"polling_interval": 0.02}
        self.worker_cm = start_worker(
            app, pool="solo", perform_ping_check=False, shutdown_timeout=30, loglevel="ERROR"
        )
        self.worker_cm.__enter__()

    def beat(self) -> None:
        """Stands in for celery beat: a watchdog tick every (scaled) interval, through the
        broker, expiring like beat's (a stale tick is superseded by the next)."""
        from jobs.tasks import watchdog_tick

        while not self.stop_beat.wait(self.timing.tick_s):
            watchdog_tick.apply_async(expires=self.timing.tick_s * 0.9)

    def stop(self) -> None:
        self.stop_beat.set()
        if self.worker_cm is not None:
            self.worker_cm.__exit__(None, None, None)
        if self.sandbox is not None:
            self.sandbox.close()
        if self.server is not None:
            self.server.shutdown()


# ---- drills ------------------------------------------------------------------------------------


def wait_for(predicate, *, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def submit_toy(heartbeat_s: int):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs import lifecycle
    from nomadgpu.models import Team

    team = Team.objects.create(name="bench", slug="bench")
    user = get_user_model().objects.create_user("bench")
    return lifecycle.submit_job(
        team=team,
        created_by=user,
        now=timezone.now(),
        name="recovery bench",
        image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
        command=f"{sys.executable} {ROOT}/examples/toy/train.py",
        env={
            "TOY_STEPS": "1000000",  # trains until the bench cancels it
            "TOY_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
            "TOY_STEP_SECONDS": str(TOY_STEP_S),
        },
        total_steps=1_000_000,
        heartbeat_interval_s=heartbeat_s,
        requirements=FIELD_REPORT_REQUIREMENTS,
        profile={"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01},
    )


def ready_to_break(job):
    """The running attempt, once it has shipped a checkpoint of its own (so the drill loses
    real progress and the replacement has something to resume from)."""
    from jobs.models import Checkpoint

    attempt = job.attempts.filter(state="running").first()
    if attempt is None:
        return None
    above = attempt.resumed_from_step or 0
    shipped = Checkpoint.objects.filter(attempt=attempt, state="ready", step__gt=above).exists()
    return attempt if shipped else None


@dataclass
class Drill:
    kind: str
    cause: str
    broken_at: datetime
    last_heartbeat_at: datetime | None
    detected_at: datetime
    rented_at: datetime
    running_again_at: datetime

    def since_break(self, moment: datetime) -> float:
        return (moment - self.broken_at).total_seconds()


def drill(job, sandbox, action: str) -> Drill:
    """Break the job's host with ACTION and wait until it trains on another one."""
    from django.utils import timezone

    from jobs.models import Interruption

    attempt = wait_for(lambda: ready_to_break(job), timeout=120, what="a checkpointed host")
    broken_at = timezone.now()
    sandbox.inject(attempt.instance_id, action)

    def recovered():
        row = Interruption.objects.filter(attempt=attempt).first()
        return row if row is not None and row.running_again_at is not None else None

    row = wait_for(recovered, timeout=180, what=f"the job to run again after {action}")
    # Each loss puts its machine on the job's avoid list; only 17 machines of the market match
    # the field report's requirements, so many drills would run out of hosts. Forgetting them
    # between drills keeps the bench about detection and re-renting, not market depth.
    type(job).objects.filter(pk=job.pk).update(avoid_machine_ids=[])
    return Drill(
        kind=action,
        cause=row.cause,
        broken_at=broken_at,
        last_heartbeat_at=row.last_heartbeat_at,
        detected_at=row.detected_at,
        rented_at=row.replacement_rented_at,
        running_again_at=row.running_again_at,
    )


# ---- report ------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


def p90(values: list[float]) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[8]


def report(destroys: list[Drill], freezes: list[Drill], first: dict, timing: Timing) -> None:
    hb = timing.heartbeat_s

    def secs(s: float) -> str:
        return f"{s:6.2f} s = {s / hb:4.2f} hb"

    detection = [d.since_break(d.detected_at) for d in destroys]
    confirmed = [d.since_break(d.detected_at) for d in destroys if d.cause.startswith("provider")]
    rerent = [(d.rented_at - d.detected_at).total_seconds() for d in destroys]
    running = [d.since_break(d.running_again_at) for d in destroys]
    frozen = [d.since_break(d.detected_at) for d in freezes]
    silent = [
        (d.detected_at - d.last_heartbeat_at).total_seconds()
        for d in freezes
        if d.last_heartbeat_at is not None
    ]
    goal = DETECTION_GOAL_S / timing.scale
    from jobs.models import HEARTBEAT_TIMEOUT_INTERVALS as timeout_hb

    causes = sorted({d.cause for d in destroys + freezes})
    print(
        f"recovery bench: {len(destroys)} destroy + {len(freezes)} freeze drills; heartbeat "
        f"{hb} s, provider poll {timing.poll_s:.2f} s, watchdog tick {timing.tick_s:.2f} s "
        f"(production / {timing.scale:g}); sandbox --fast; 1 hb = {PRODUCTION_HEARTBEAT_S:g} s "
        "in production"
    )
    print(
        "causes: "
        + ", ".join(f"{c} {sum(d.cause == c for d in destroys + freezes)}" for c in causes)
    )

    def plain(s: float) -> str:
        return f"{s:6.2f} s"

    timeout = f"heartbeat timeout {timeout_hb} hb = {timeout_hb * hb} s"
    # (figure, samples, how a value prints, baseline text, baseline value)
    figures = [
        ("destroy → detected", detection, secs, f"heartbeat interval {hb} s", hb),
        (
            "provider-confirmed detection",
            confirmed,
            secs,
            f"{DETECTION_GOAL_S:g} s goal scaled = {goal:.2f} s",
            goal,
        ),
        (
            "detected → replacement rented",
            rerent,
            plain,
            f"first rent in this run {first['rent']:.2f} s",
            first["rent"],
        ),
        (
            "destroy → running again",
            running,
            plain,
            f"first start in this run {first['start']:.2f} s",
            first["start"],
        ),
        ("freeze → detected", frozen, secs, timeout, timeout_hb * hb),
        ("last heartbeat → freeze detected", silent, secs, timeout, timeout_hb * hb),
    ]
    rows = [
        line(f"{figure}, {name}", show(stat(samples)), baseline, stat(samples) / base)
        for figure, samples, show, baseline, base in figures
        if samples
        for name, stat in (("median", median), ("p90", p90))
    ]
    print("\n".join(rows))
    print(
        "in production seconds (x "
        f"{timing.scale:g}): destroy detection median {median(detection) * timing.scale:.0f} s,"
        f" p90 {p90(detection) * timing.scale:.0f} s; freeze detection median "
        f"{median(frozen) * timing.scale:.0f} s, p90 {p90(frozen) * timing.scale:.0f} s "
        "(field report: ~30 s)"
    )


def run_field_report(quick: bool, detection_s: float) -> int:
    """The field-report part, as its own process (Django is set up once per process, and that
    part needs an installation of its own), given this part's detection median."""
    script = ROOT / "bench" / "support" / "field_report.py"
    argv = [sys.executable, str(script), "--detection-s", f"{detection_s:.2f}"]
    return subprocess.run([*argv, *(["--quick"] if quick else [])]).returncode


def main() -> int:
    args = parse_args()
    detection_s = run_detection(args)
    if args.no_field_report:
        return 0
    return run_field_report(args.quick, detection_s)


def run_detection(args: argparse.Namespace) -> float:
    """The detection drills and their report; the median destroy detection, production s."""
    timing = Timing(args.heartbeat_s)
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-recovery-bench-"))
    configure(tmp)
    installation = Installation(tmp, timing)
    try:
        installation.start()
        from django.utils import timezone

        from jobs import lifecycle

        job = submit_toy(args.heartbeat_s)
        first = wait_for(
            lambda: job.attempts.filter(number=1, state="running").first(),
            timeout=120,
            what="the job's first start",
        )
        started = {
            "rent": (first.rented_at - job.created_at).total_seconds(),
            "start": (first.running_at - job.created_at).total_seconds(),
        }
        destroys, freezes = [], []
        for i in range(args.drills):
            destroys.append(drill(job, installation.sandbox, "destroy"))
            freezes.append(drill(job, installation.sandbox, "freeze"))
            print(
                f"drill {i + 1}/{args.drills}: destroy ({destroys[-1].cause}) and freeze "
                f"({freezes[-1].cause}) recovered",
                file=sys.stderr,
            )
        lifecycle.cancel_job(job.pk, now=timezone.now(), by="the bench")
        report(destroys, freezes, started, timing)
        detection = median([d.since_break(d.detected_at) for d in destroys]) * timing.scale
    finally:
        installation.stop()
        keep_or_remove(tmp, keep=args.keep)
    return detection


if __name__ == "__main__":
    sys.exit(main())
