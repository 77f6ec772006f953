"""The whole supervisor against the sandbox: a live web process (agent API, local storage), a
real Celery worker on the configured broker, watchdog ticks sent through it, the real agent in
sandbox instances running the toy trainer.

Not a plugin: its ``sandbox`` and ``celery_worker_thread`` replace the suite's own
(``tests.support.sandbox``, ``tests.support.processes``) for the tests that run the whole
supervisor, so the conftests of tests/e2e/ and tests/hf/ (and the browser test that needs it)
import its fixtures, and only they get them."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from jobs import lifecycle
from jobs.models import Job
from jobs.tasks import watchdog_tick
from tests.support.factories import TeamFactory, UserFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.toy import TOY, TOY_ENV


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
            # One instance per rent unless the test races (JobSpec's default is "auto").
            "race": "off",
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


@contextmanager
def passing(run, every_s: float = 0.5):
    """RUN every EVERY_S in a thread of its own (as a worker process of its own runs a beat
    entry in production), until the block ends; what RUN raised fails the test at the end."""
    from django.db import connection

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.wait(every_s):
                run()
        except Exception as exc:  # re-raised in the test's thread below
            errors.append(exc)
        finally:
            connection.close()  # this thread's own (PostgreSQL drops the test database later)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if errors:
        raise errors[0]


@pytest.fixture
def supervisor(live_server, settings, sandbox, tmp_path, celery_worker_thread):
    settings.SITE_URL = live_server.url
    point_at_sandbox(settings, sandbox, tmp_path)
    with beating(watchdog_tick):
        yield Supervisor(sandbox, TeamFactory(slug="e2e"), UserFactory(username="e2e"))
