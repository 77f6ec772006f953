"""Tasks travel through the real broker (Redis in CI, the filesystem transport embedded) and a
real worker runs them; beat's schedule reaches the watchdog end to end."""

from __future__ import annotations

import pytest
from django.conf import settings

from nomadgpu.models import ServiceHeartbeat
from nomadgpu.tasks import record_ping
from tests.processes import celery_command, subprocess_env, wait_until


def test_a_task_sent_through_the_broker_is_run_by_a_worker(celery_worker_thread):
    record_ping.delay("broker-roundtrip")

    wait_until(
        lambda: ServiceHeartbeat.objects.filter(name="broker-roundtrip").exists(),
        timeout=30,
        what="the worker to run record_ping",
    )


def test_the_broker_is_the_configured_one(celery_worker_thread):
    transport = celery_worker_thread.app.connection_for_read().transport_cls
    expected = settings.CELERY_BROKER_URL.split("://")[0]
    assert transport == expected


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_beat_schedules_the_watchdog_and_a_worker_process_runs_it(processes, tmp_path):
    env = subprocess_env(NOMADGPU_VAR_DIR=str(tmp_path / "var"), WATCHDOG_INTERVAL_S="1")
    processes.start("worker", celery_command("worker", "--pool=solo", "-l", "INFO"), env)
    processes.start("beat", celery_command("beat", "-l", "INFO"), env)

    def ticked_twice():
        beat = ServiceHeartbeat.objects.filter(name="watchdog").first()
        return beat is not None and beat.count >= 2

    try:
        wait_until(ticked_twice, timeout=90, what="two watchdog ticks from beat via the worker")
    except BaseException:
        print(processes.log("beat")[-3000:], processes.log("worker")[-3000:])
        raise


def test_the_watchdog_tick_is_on_the_beat_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["watchdog-tick"]
    assert entry["task"] == "jobs.tasks.watchdog_tick"
    assert entry["options"]["expires"] < entry["schedule"].total_seconds()
