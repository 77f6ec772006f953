"""Tasks travel through the real broker (Redis in CI, the filesystem transport embedded) and a
real worker runs them; beat's schedule reaches the watchdog end to end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from django.conf import settings
from django.utils import timezone

from nomadgpu.models import ServiceHeartbeat
from nomadgpu.tasks import record_ping
from tests.support.processes import ROOT, celery_command, subprocess_env, wait_until


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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_tick_is_dropped_at_a_one_second_interval_on_the_filesystem_broker(processes, tmp_path):
    # The operator's setup (Procfile): the embedded broker, beat, 1 s ticks, the watchdog's
    # own worker of one process and a worker of two for the rest. Beat logs each tick's id as
    # it is sent (DEBUG), the watchdog worker each id it ran or discarded: every tick sent
    # from the first that ran on must run. Ticks beat sent while the worker was still starting
    # may expire unseen (their `expires` is shorter than the interval).
    env = subprocess_env(
        NOMADGPU_VAR_DIR=str(tmp_path / "var"),
        CELERY_BROKER_URL="filesystem://",
        WATCHDOG_INTERVAL_S="1",
        NOTIFY_INTERVAL_S="1",
        LOG_LEVEL="DEBUG",  # the lines of each tick sent, run, discarded (nomadgpu/settings.py)
        PROVIDER_POLL_INTERVAL_S="3600",
    )
    # No provider runs here, and a poll of an absent one holds the watchdog's only process for
    # its ~8 s of connection retries: every tick sent meanwhile rightly expires (a provider
    # outage, not the broker). The poll slot is taken now, so no tick polls while the test
    # watches (jobs.watchdog.passes.provider_poll_due).
    ServiceHeartbeat.objects.create(name="provider-poll", last_seen_at=timezone.now())
    processes.start(
        "watchdog",
        celery_command(
            "worker", "-Q", "watchdog", "--hostname=watchdog@%h", "--concurrency=1", "-l", "INFO"
        ),
        env,
    )
    processes.start(
        "worker-rest",
        celery_command(
            "worker", "-Q", "celery", "--hostname=worker@%h", "--concurrency=2", "-l", "INFO"
        ),
        env,
    )
    beat = processes.start("beat", celery_command("beat", "-l", "DEBUG"), env)

    def ticks() -> int:
        beat = ServiceHeartbeat.objects.filter(name="watchdog").first()
        return beat.count if beat else 0

    def worker_log_ids(pattern: str) -> set[str]:
        return set(re.findall(pattern, processes.log("watchdog")))

    def ran() -> set[str]:
        return worker_log_ids(r"Task jobs\.tasks\.watchdog_tick\[([\w-]+)\] succeeded")

    def discarded() -> set[str]:
        return worker_log_ids(r"Discarding revoked task: jobs\.tasks\.watchdog_tick\[([\w-]+)\]")

    try:
        wait_until(lambda: ticks() >= 31, timeout=180, what="31 watchdog ticks")
        os.killpg(beat.pid, signal.SIGTERM)  # no tick is sent after this
        beat.wait(timeout=30)
        sent = re.findall(r"jobs\.tasks\.watchdog_tick sent\. id->([\w-]+)", processes.log("beat"))
        after_first = sent[min(sent.index(tick) for tick in ran() if tick in sent) :]
        wait_until(
            lambda: set(after_first) <= ran() | discarded(),
            timeout=60,
            what="the worker to take every tick beat sent",
        )
    except BaseException:
        print(processes.log("beat")[-3000:], processes.log("watchdog")[-3000:])
        raise
    assert discarded().isdisjoint(after_first), processes.log("watchdog")[-3000:]
    assert set(after_first) <= ran()
    assert len(after_first) >= 31


def test_settings_refuse_ticks_that_would_expire_before_a_worker_sees_them(tmp_path):
    env = subprocess_env(
        NOMADGPU_VAR_DIR=str(tmp_path / "var"),
        CELERY_BROKER_URL="filesystem://",
        WATCHDOG_INTERVAL_S="1",
        BROKER_POLLING_INTERVAL_S="1",
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Set BROKER_POLLING_INTERVAL_S to at most 0.45" in result.stderr


def test_the_watchdog_tick_is_on_the_beat_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["watchdog-tick"]
    assert entry["task"] == "jobs.tasks.watchdog_tick"
    assert entry["options"]["expires"] < entry["schedule"].total_seconds()
