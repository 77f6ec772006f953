"""Real processes for tests: a Celery worker on the configured broker, subprocess helpers,
and polling with a deadline (never sleep-and-assert)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], object], *, timeout: float, what: str, every=0.1):
    """Poll PREDICATE until it returns something truthy; fail saying WHAT did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def database_url_of_test_db() -> str:
    """A DATABASE_URL naming the database the tests use, for processes started by tests."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def subprocess_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url_of_test_db(),
        FIELD_ENCRYPTION_KEY=",".join(settings.FIELD_ENCRYPTION_KEYS),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


class ProcessGroup:
    """Processes started by one test; all of them are stopped when it ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def processes(tmp_path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path)
    yield group
    group.stop_all()


def celery_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "nomadgpu", *args]


@pytest.fixture
def celery_worker_thread(transactional_db):
    """A real Celery worker (in-process thread, solo pool) consuming the configured broker.

    Messages an earlier test left on the broker are purged first: a task another test enqueued
    (a destroy sent after a commit, say, to a sandbox long gone) would otherwise keep this
    worker retrying past its shutdown timeout. At the end it is told to stop and woken by two
    messages that expire on arrival, so it stops at once instead of after its next drains
    (``tests.support.supervisor`` does the same for the end-to-end runs)."""
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state

    from nomadgpu.celery import app
    from nomadgpu.tasks import record_ping

    app.control.purge()
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as worker:
        yield worker
        state.should_terminate = 0
        for _ in range(2):
            record_ping.apply_async(args=["wake-up"], expires=0.001)
