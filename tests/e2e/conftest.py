"""The whole supervisor against the sandbox: live web process (agent API, local storage), a real
Celery worker on the configured broker, watchdog ticks sent through it, the real agent in
sandbox instances running the toy trainer."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest

from jobs import services
from jobs.models import Job
from jobs.tasks import watchdog_tick
from tests.factories import TeamFactory, UserFactory
from tests.processes import ROOT

TOY = f"{sys.executable} {ROOT}/examples/toy/train.py"
TOY_ENV = {"TOY_STEPS": "300", "TOY_CHECKPOINT_EVERY": "50", "TOY_STEP_SECONDS": "0.08"}
FIELD_REPORT_REQUIREMENTS = {
    "gpu_names": ["RTX 4090"],
    "min_reliability": 0.98,
    "min_inet_down_mbps": 500,
    "disk_gb": 20,
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
        return services.submit_job(
            team=self.team, created_by=self.user, now=timezone.now(), **fields
        )


@pytest.fixture
def supervisor(live_server, settings, sandbox, tmp_path, celery_worker_thread):
    settings.SITE_URL = live_server.url
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = "sandbox-key"
    settings.PROVIDER_POLL_INTERVAL_S = 1.0
    stop = threading.Event()

    def beat() -> None:
        # Stands in for celery beat at a 0.5 s cadence: the ticks still go through the broker
        # to the worker (beat's own schedule is proven in test_celery_broker).
        while not stop.wait(0.5):
            watchdog_tick.apply_async(expires=2)

    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    yield Supervisor(sandbox, TeamFactory(slug="e2e"), UserFactory(username="e2e"))
    stop.set()
    ticker.join()


@pytest.fixture(scope="session")
def uninterrupted_digest(tmp_path_factory) -> str:
    """The toy trainer's final digest without any interruption (the reference)."""
    out = tmp_path_factory.mktemp("toy-reference")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples/toy/train.py")],
        env={
            "PYTHONPATH": str(ROOT),
            **TOY_ENV,
            "TOY_STEP_SECONDS": "0",
            "NOMAD_CHECKPOINT_DIR": str(out),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1].removeprefix("final-digest: ")
