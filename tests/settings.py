"""The test run's settings: the project's, with each pytest-xdist worker given a world of its own.

pytest-django loads this module (pyproject's ``DJANGO_SETTINGS_MODULE``) before anything else
reads a setting, and processes a test starts inherit it through the environment, so they see
the same world:

- ``NOMADGPU_VAR_DIR``: its own folder (the SQLite test database, the filesystem broker, the
  agent zipapp cache, beat's schedule).
- ``CELERY_BROKER_URL``: on Redis, its own database number, counted down from the one given
  (``/15`` → 15 for gw0, 14 for gw1): a worker's Celery consumer must never take another's tasks.

PostgreSQL needs nothing here: pytest-django already names each worker's test database
``test_<name>_gw<N>``. Without xdist (``make test PYTEST_WORKERS=0``) nothing changes.
``NOMADGPU_TEST_WORLD`` records that the environment was already moved, so a process started by a
test, which imports this module again with the worker's variables, does not move it twice.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def redis_db_for(url: str, index: int) -> str:
    """URL with its database number moved down by INDEX (Redis has 16, 0-15)."""
    match = re.fullmatch(r"(rediss?://[^/]*)(?:/(\d+))?", url)
    if not match:
        return url
    db = int(match.group(2) or 0) - index
    if db < 0:
        raise RuntimeError(f"too many xdist workers for {url}: worker {index} has no database left")
    return f"{match.group(1)}/{db}"


def _isolate() -> None:
    index = worker_index()
    if index is None or os.environ.get("NOMADGPU_TEST_WORLD") == f"gw{index}":
        return
    os.environ["NOMADGPU_TEST_WORLD"] = f"gw{index}"
    base = Path(os.environ.get("NOMADGPU_VAR_DIR") or ROOT / "var" / "test")
    os.environ["NOMADGPU_VAR_DIR"] = str(base / f"gw{index}")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if broker.startswith("redis"):
        os.environ["CELERY_BROKER_URL"] = redis_db_for(broker, index)


_isolate()

from nomadgpu.settings import *  # noqa: E402, F403

# No web beacon in the test process (a test importing nomadgpu.wsgi would start one writing into
# every later test's database); a web process a test starts gets the one it is given.
WEB_BEACON_INTERVAL_S = float(os.environ.get("WEB_BEACON_INTERVAL_S", "0"))
