"""The console of `make run`: one line per job event and the warnings; LOG_LEVEL=DEBUG brings
back the line per HTTP request, task and beat tick; a refused request is one line, once."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import lifecycle
from tests.support.factories import JobFactory
from tests.support.processes import ROOT, subprocess_env

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


@pytest.fixture
def console(settings):
    """What the configured console handlers print (Django's own and the root's), as text;
    DEBUG on, as under `make run`: Django's own console handler prints only then."""
    settings.DEBUG = True
    stream, swapped = io.StringIO(), []
    for name in ("", "django", "django.request"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:  # not pytest's capturing subclasses
                swapped.append((handler, handler.setStream(stream)))
    yield stream
    for handler, old in swapped:
        handler.setStream(old)


@pytest.mark.django_db
def test_a_member_refused_the_finance_page_is_one_console_line_with_the_reason(
    client, cast, console
):
    client.force_login(cast.member)

    response = client.get(reverse("finance-summary", args=[cast.team_a.slug]))

    printed = console.getvalue()
    assert response.status_code == 403
    assert printed.count("Forbidden (Permission denied)") == 1, printed
    assert "Traceback" not in printed
    assert "finance and admin roles" in printed
    assert len(printed.strip().splitlines()) == 1


@pytest.mark.django_db
def test_djangos_warnings_are_printed_once(client, cast, console):
    client.force_login(cast.member)

    client.get("/no-such-page/")

    assert console.getvalue().count("Not Found: /no-such-page/") == 1
