"""The operator's setup after a fresh deploy: a prefork worker of two processes and beat, as
separate processes, renting several jobs at once before the agent zipapp was ever built."""

from __future__ import annotations

import shutil

import pytest

from jobs.models import AttemptState
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import celery_command, subprocess_env, wait_until
from tests.support.toy import TOY, toy_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_three_jobs_submitted_at_once_on_a_fresh_deploy_all_start(
    live_server, sandbox, processes, tmp_path, settings
):
    from django.utils import timezone

    from jobs import lifecycle
    from tests.support.factories import TeamFactory, UserFactory

    settings.SITE_URL = live_server.url
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    shutil.rmtree(settings.VAR_DIR / "agent", ignore_errors=True)  # never built: a fresh deploy
    env = subprocess_env(
        # The test's broker and var dir, so the rent messages sent at submit reach this worker.
        NOMADGPU_VAR_DIR=str(settings.VAR_DIR),
        SITE_URL=live_server.url,
        VAST_URL=sandbox.url,
        VAST_API_KEY="sandbox-key",
        STORAGE_BACKEND="local",
        STORAGE_LOCAL_DIR=str(tmp_path / "objects"),
        WATCHDOG_INTERVAL_S="1",
        PROVIDER_POLL_INTERVAL_S="1",
    )
    processes.start("worker", celery_command("worker", "--concurrency=2", "-l", "INFO"), env)
    processes.start("beat", celery_command("beat", "-l", "INFO"), env)
    team, user = TeamFactory(slug="fresh"), UserFactory(username="fresh")
    steps = toy_env(steps=400, every=100, step_seconds=0.05)
    jobs = [
        lifecycle.submit_job(
            team=team, created_by=user, now=timezone.now(), name=f"toy-{n}",
            image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime", command=TOY, env=steps,
            total_steps=400, heartbeat_interval_s=1, requirements=FIELD_REPORT_REQUIREMENTS,
            profile={"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01},
        )
        for n in range(3)
    ]  # fmt: skip

    def all_running() -> bool:
        return all(job.attempts.filter(state=AttemptState.RUNNING).exists() for job in jobs)

    try:
        # Well under REQUESTED_GRACE_S (300 s): an attempt stuck `requested` fails this.
        wait_until(all_running, timeout=120, what="all three jobs to run")
    except BaseException:
        print(processes.log("worker")[-5000:])
        raise
    for job in jobs:
        # On failure, why an attempt ended before renting (the no_offers event says: a search
        # that failed, every chosen offer taken, ...): seen once under make test-stress.
        said = list(job.events.filter(kind="no_offers").values_list("message", flat=True))
        assert job.attempts.count() == 1, (
            list(job.attempts.values("number", "end_reason")),
            said,
            processes.log("worker")[-3000:],
        )
    assert "FileNotFoundError" not in processes.log("worker")
