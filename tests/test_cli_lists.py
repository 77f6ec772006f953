"""What the ``nomadgpu`` CLI lists: the server's templates in ``submit --help`` (the CLI keeps
their names, since it installs without the server), and ``status`` against a live server:
jobs newest first with id and submitted time, and a job with no step yet waiting for its first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.job_templates import JOB_TEMPLATES
from nomadgpu import api_tokens
from nomadgpu_cli import cli, render
from nomadgpu_cli.submit import TEMPLATES
from tests.support.factories import JobFactory, make_attempt

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_knows_the_servers_templates():
    assert list(TEMPLATES) == list(JOB_TEMPLATES)


def test_submit_help_lists_every_template_of_the_server():
    env = {**os.environ, "COLUMNS": "200"}  # argparse wraps the help at the terminal's width
    done = subprocess.run(
        [sys.executable, "-m", "nomadgpu_cli", "submit", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    line = next(x for x in done.stdout.splitlines() if "--template" in x and "toy" in x)
    assert ", ".join(JOB_TEMPLATES) in line  # toy, qlora-tiny, qlora


@pytest.mark.parametrize(
    ("job", "shown"),
    [
        ({"state": "starting", "step": None, "total_steps": 600, "progress": None},
         "[..............................] waiting for the first step of 600  starting"),
        ({"state": "cancelled", "step": None, "total_steps": 600, "progress": None},
         "[..............................] no step reported  cancelled"),
        ({"state": "running", "step": 150, "total_steps": 300, "progress": 0.5, "eta_s": 75},
         "[###############...............] 150/300  50%  ETA 1 min 15 s  running"),
    ],
)  # fmt: skip
def test_the_progress_bar_waits_for_the_first_step_instead_of_printing_unknowns(job, shown):
    assert render.progress_bar(job) == shown


@pytest.mark.django_db(transaction=True)
def test_status_lists_jobs_newest_first_with_id_and_submitted_time(live_server, cast, capsys):
    now = timezone.now()
    older = JobFactory(team=cast.team_a, name="toy", created_at=now - timedelta(hours=1))
    newer = JobFactory(team=cast.team_a, name="toy", created_at=now, total_steps=600)
    make_attempt(newer, state="running")
    token = api_tokens.create_token(user=cast.member, name="cli", now=now)[1]

    code = cli.main(["--url", live_server.url, "--token", token, "status"])

    lines = capsys.readouterr().out.splitlines()
    assert code == cli.EXIT_OK
    assert lines[0].split()[:3] == ["ID", "SUBMITTED", "TEAM"]
    rows = [line.split() for line in lines[1:]]
    assert [int(r[0]) for r in rows] == [newer.pk, older.pk]
    for row, job in zip(rows, (newer, older), strict=True):
        assert " ".join(row[1:3]) == f"{job.created_at.astimezone():%Y-%m-%d %H:%M}"
    assert rows[0][6] == "waiting"  # the STEP column of a job on a host with no step yet
