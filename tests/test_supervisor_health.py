"""``manage.py check`` says when the watchdog fell behind, and only when that is true: while
beat, which schedules it, is up (``nomadgpu.health``). A restart before beat could have run is
quiet."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from nomadgpu import health
from nomadgpu.models import ServiceHeartbeat
from tests.support.factories import ServiceHeartbeatFactory
from tests.support.processes import celery_command, subprocess_env, wait_until


def database_check() -> str:
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def last_tick(seconds_ago: float) -> None:
    ServiceHeartbeatFactory(name="watchdog", last_seen_at=ago(seconds_ago))


@pytest.fixture
def interval(settings):
    settings.WATCHDOG_INTERVAL_S = 1


@pytest.mark.django_db
def test_check_says_the_watchdog_has_not_run_for_a_while_while_beat_is_up(interval):
    health.record_beat_started(now=ago(3600))
    last_tick(50)

    report = database_check()

    assert "nomadgpu.W010" in report
    assert "watchdog has not run for 5" in report  # 50 s, plus the test's own seconds
    assert "celery beat" in report


@pytest.mark.django_db
def test_check_is_quiet_while_the_watchdog_keeps_up(interval):
    health.record_beat_started(now=ago(3600))
    last_tick(0)

    assert "W010" not in database_check()


@pytest.mark.django_db
def test_a_restart_after_a_clean_stop_is_quiet_before_beat_starts_again(interval):
    # `make run` again: the old beat stopped with Ctrl-C; migrate runs the check first.
    health.record_beat_started(now=ago(3600))
    last_tick(600)
    health.record_beat_stopped(now=ago(599))

    assert "W010" not in database_check()


@pytest.mark.django_db
def test_a_beat_that_just_started_gets_the_grace_of_a_late_tick(interval):
    last_tick(600)
    health.record_beat_stopped(now=ago(599))
    health.record_beat_started(now=ago(1))

    assert health.watchdog_lag_problem(now=timezone.now()) is None


@pytest.mark.django_db
def test_a_beat_up_for_long_without_a_single_tick_is_behind(interval):
    last_tick(600)
    health.record_beat_started(now=ago(30))

    problem = health.watchdog_lag_problem(now=timezone.now())

    assert problem is not None
    assert problem.startswith("watchdog has not run for 30 s, since beat started")


@pytest.mark.django_db
def test_nothing_is_behind_before_beat_ever_ran(interval):
    last_tick(600)  # written by a tick run by hand; beat never started here

    assert health.watchdog_lag_problem(now=timezone.now()) is None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_beat_records_its_start_and_its_clean_stop(processes, tmp_path):
    env = subprocess_env(NOMADGPU_VAR_DIR=str(tmp_path / "var"), WATCHDOG_INTERVAL_S="1")
    beat = processes.start("beat", celery_command("beat", "-l", "INFO"), env)

    def beat_row():
        return ServiceHeartbeat.objects.filter(name="beat").first()

    try:
        wait_until(lambda: health.beat_up_since(beat_row()), timeout=60, what="beat's start")
        processes.stop_all()  # SIGTERM, as honcho's Ctrl-C and docker stop send
        assert beat.returncode is not None
        wait_until(lambda: "stopped_at" in beat_row().detail, timeout=15, what="beat's stop")
    except BaseException:
        print(processes.log("beat")[-3000:])
        raise
    assert health.beat_up_since(beat_row()) is None
