"""The console of `make run`: one line per job event and the warnings; LOG_LEVEL=DEBUG brings
back the line per HTTP request, task and beat tick."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from django.utils import timezone

from jobs import lifecycle
from tests.factories import JobFactory
from tests.processes import ROOT, subprocess_env

LEVELS = (
    "import logging; "
    "print(*(logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) for n in "
    "('django.server', 'httpx', 'celery.app.trace', 'celery.beat', 'nomadgpu.events')))"
)


def effective_levels(tmp_path, **env: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", LEVELS],
        cwd=ROOT, env=subprocess_env(NOMADGPU_VAR_DIR=str(tmp_path), **env),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1].split()  # after the shell's own notice


def test_repeating_lines_are_hidden_unless_log_level_is_debug(tmp_path):
    quiet = effective_levels(tmp_path, LOG_LEVEL="INFO")
    assert quiet == ["WARNING", "WARNING", "WARNING", "WARNING", "INFO"]
    assert effective_levels(tmp_path, LOG_LEVEL="DEBUG") == ["DEBUG"] * 5


@pytest.mark.django_db(transaction=True)
def test_each_job_event_is_one_console_line(caplog):
    job = JobFactory()
    with caplog.at_level(logging.INFO, logger="nomadgpu.events"):
        lifecycle.record_event(job.pk, now=timezone.now(), kind="no_offers", message="none fit")
        lifecycle.record_event(job.pk, now=timezone.now(), kind="checkpoint_ready")

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "nomadgpu.events"]
    assert lines == [
        ("WARNING", f"job {job.pk}: no offers: none fit"),
        ("INFO", f"job {job.pk}: checkpoint ready"),
    ]
