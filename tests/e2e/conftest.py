"""The whole supervisor against the sandbox: live web process (agent API, local storage), a real
Celery worker on the configured broker, watchdog ticks sent through it, the real agent in
sandbox instances running the toy trainer."""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.conf import settings

from hosts.vast import RetryPolicy, VastClient, VastError
from jobs import lifecycle
from jobs.models import Attempt, AttemptState, Checkpoint, Interruption, Job
from jobs.tasks import watchdog_tick
from tests.support.factories import TeamFactory, UserFactory
from tests.support.processes import ROOT, wait_until
from tests.support.sandbox import DEFAULT_KEY

TOY = f"{sys.executable} {ROOT}/examples/toy/train.py"
TOY_ENV = {"TOY_STEPS": "300", "TOY_CHECKPOINT_EVERY": "50", "TOY_STEP_SECONDS": "0.08"}
# On demand, as the field report rented: these runs' prices and budgets are its rates (a job
# that leaves `rental` out gets JobSpec's `auto`, which bids on this market).
FIELD_REPORT_REQUIREMENTS = {
    "gpu_names": ["RTX 4090"],
    "min_reliability": 0.98,
    "min_inet_down_mbps": 500,
    "disk_gb": 20,
    "rental": "on-demand",
}


@dataclass
class Supervisor:
    sandbox: object
    team: object
    user: object

    def submit_toy(self, **overrides) -> Job:
        from django.utils import timezone

        fields = {
            "name": "toy",
            "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
            "command": TOY,
            "env": dict(TOY_ENV),
            "total_steps": 300,
            "heartbeat_interval_s": 1,
            "requirements": FIELD_REPORT_REQUIREMENTS,
            "profile": {"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01},
            **overrides,
        }
        return lifecycle.submit_job(
            team=self.team, created_by=self.user, now=timezone.now(), **fields
        )


@pytest.fixture
def celery_worker_thread(transactional_db):
    """``tests.support.processes``' in-process worker, tuned for these runs.

    - Messages left by an earlier test are purged first: a delayed retry of "destroy instance
      21000001" would otherwise hit this test's sandbox, whose ids start at the same number.
    - At the end the worker is told to stop and woken by two messages (its loop drains once
      more after seeing the flag), so it stops at once instead of after up to two 2 s drains.
    """
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state

    from nomadgpu.celery import app

    app.control.purge()
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as w:
        yield w
        state.should_terminate = 0
        for _ in range(2):  # wake-up calls: expired on arrival (a tick run anyway is harmless)
            watchdog_tick.apply_async(expires=0.001)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "sandbox_flags(*flags): extra flags for the e2e sandbox (after --fast)"
    )


@pytest.fixture
def sandbox(sandbox_factory, request):
    """The fast sandbox, with the test's ``sandbox_flags`` marker's flags if it has one."""
    marker = request.node.get_closest_marker("sandbox_flags")
    return sandbox_factory(*(marker.args if marker else ()))


def point_at_sandbox(settings, sandbox, tmp_path) -> None:
    """The settings every e2e supervisor runs with: the sandbox as Vast, local storage, and the
    backstops for lost messages acting within seconds, not production's 30 s / 2 min (a lost
    rent message is sent again, an instance whose destroy message was lost is reaped)."""
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = "sandbox-key"
    settings.PROVIDER_POLL_INTERVAL_S = 1.0
    settings.RENT_NUDGE_AFTER_S = 2
    settings.ORPHAN_GRACE_S = 5


@contextmanager
def beating(task, every_s: float = 0.5):
    """Stands in for celery beat: TASK every EVERY_S through the broker to the worker (beat's own
    schedule is proven in test_celery_broker), until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            task.apply_async(expires=2)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def supervisor(live_server, settings, sandbox, tmp_path, celery_worker_thread):
    settings.SITE_URL = live_server.url
    point_at_sandbox(settings, sandbox, tmp_path)
    with beating(watchdog_tick):
        yield Supervisor(sandbox, TeamFactory(slug="e2e"), UserFactory(username="e2e"))


@pytest.fixture
def enforcer(supervisor):
    """Stands in for beat's budget-enforce entry at the e2e cadence (through the broker)."""
    from billing.tasks import enforce_budgets

    with beating(enforce_budgets):
        yield


@pytest.fixture(scope="session")
def uninterrupted_digest() -> str:
    """The toy trainer's final digest without any interruption (the reference)."""
    return toy_digest(TOY_ENV)


@functools.cache
def _toy_digest(items: frozenset) -> str:
    with tempfile.TemporaryDirectory(prefix="toy-reference-") as out:
        result = subprocess.run(
            [sys.executable, str(ROOT / "examples/toy/train.py")],
            env={
                "PYTHONPATH": str(ROOT),
                **dict(items),
                "TOY_STEP_SECONDS": "0",
                "NOMAD_CHECKPOINT_DIR": out,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    return result.stdout.strip().splitlines()[-1].removeprefix("final-digest: ")


def toy_digest(env: dict[str, str]) -> str:
    """The final digest of an uninterrupted toy run with ENV (computed once per env)."""
    return _toy_digest(frozenset(env.items()))


def toy_env(steps: int, every: int, step_seconds: float) -> dict[str, str]:
    """A shorter toy run than the field report's, for scenarios that only need some steps."""
    return {
        "TOY_STEPS": str(steps),
        "TOY_CHECKPOINT_EVERY": str(every),
        "TOY_STEP_SECONDS": str(step_seconds),
    }


# ---- polling helpers (never sleep-and-assert) -----------------------------------------------


def state_of(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def wait_state(job: Job, *states: str, timeout: float = 90) -> str:
    """Wait until JOB is in one of STATES; fail early if it ends in another terminal state."""

    def reached() -> str | None:
        state = state_of(job)
        if state in states:
            return state
        if lifecycle.is_terminal(state):
            pytest.fail(f"job {job.pk} ended {state} ({job.failure_reason}), wanted {states}")
        return None

    return wait_until(reached, timeout=timeout, what=f"job {job.pk} to be {'/'.join(states)}")


def running_attempt(job: Job, number: int | None = None) -> Attempt | None:
    attempts = job.attempts.filter(state=AttemptState.RUNNING)
    if number is not None:
        attempts = attempts.filter(number=number)
    return attempts.first()


def wait_running(job: Job, number: int | None = None, timeout: float = 60) -> Attempt:
    """Wait until JOB trains on a host (attempt NUMBER, when given)."""
    return wait_until(
        lambda: running_attempt(job, number),
        timeout=timeout,
        what=f"job {job.pk} to run" + (f" attempt {number}" if number else ""),
    )


def wait_checkpoint(job: Job, *, attempt: Attempt | None = None, above: int = 0) -> Checkpoint:
    """Wait for a ready checkpoint of JOB (of ATTEMPT, when given) at a step above ABOVE."""
    found = Checkpoint.objects.filter(job=job, state="ready", step__gt=above)
    if attempt is not None:
        found = found.filter(attempt=attempt)
    return wait_until(
        lambda: found.order_by("-step").first(),
        timeout=60,
        what=f"a ready checkpoint of job {job.pk} above step {above}",
    )


def wait_interruption(attempt: Attempt, timeout: float = 60) -> Interruption:
    return wait_until(
        lambda: Interruption.objects.filter(attempt=attempt).first(),
        timeout=timeout,
        what=f"the loss of attempt {attempt.number} of job {attempt.job_id} to be detected",
    )


class InstanceWatch:
    """Lists the sandbox account's instances in a thread, every 50 ms, for the whole test, and
    keeps the largest number of instances that existed at once per label prefix: the way to
    prove that a job never had two hosts billing at the same time."""

    def __init__(self, sandbox) -> None:
        self.sandbox = sandbox
        self.peak: dict[str, int] = {}
        self.seen: dict[int, str] = {}  # every instance id ever listed -> its label
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with VastClient(DEFAULT_KEY, self.sandbox.url, retry=RetryPolicy(attempts=1)) as client:
            while not self.stop.wait(0.05):
                try:
                    instances = client.list_instances()
                except VastError:
                    self.errors += 1
                    continue
                counts: dict[str, int] = {}
                for inst in instances:
                    self.seen[inst.id] = inst.label or ""
                    prefix = (inst.label or "").rsplit(":", 1)[0]
                    counts[prefix] = counts.get(prefix, 0) + 1
                for prefix, count in counts.items():
                    self.peak[prefix] = max(self.peak.get(prefix, 0), count)

    def job_prefix(self, job: Job) -> str:
        return f"ngpu:{settings.NOMADGPU_ENV}:{job.pk}"

    def peak_for(self, job: Job) -> int:
        return self.peak.get(self.job_prefix(job), 0)

    def ids_for(self, job: Job) -> set[int]:
        prefix = self.job_prefix(job) + ":"
        return {i for i, label in self.seen.items() if label.startswith(prefix)}

    def __enter__(self) -> InstanceWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def live_instances(sandbox, job: Job | None = None) -> list:
    """The sandbox account's instances now (those of JOB's labels, when given)."""
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        instances = client.list_instances()
    if job is None:
        return instances
    prefix = f"ngpu:{settings.NOMADGPU_ENV}:{job.pk}:"
    return [i for i in instances if (i.label or "").startswith(prefix)]
