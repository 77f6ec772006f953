"""Spending limits across processes and threads: a worker that starts enforces at once, and two
rents planned at the same moment cannot both take the last of a team's budget."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from billing.models import BudgetReservation
from billing.services import reserve_for_rent
from jobs.models import Job
from tests.support.factories import JobFactory, TeamBudgetFactory, TeamFactory, make_attempt
from tests.support.processes import celery_command, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

H100_RATES = {"dph_base": 1.728479, "storage_usd_per_gb_hour": 0.000304, "disk_gb": 20.0}
STEPS_FOR_41_CENTS = {"total_steps": 900, "requirements": {"disk_gb": 20}}  # 1 h at $0.40/h


def spent_today(team, *, hours: float) -> None:
    """An ended attempt of another job that cost HOURS of an H100 earlier today."""
    now = timezone.now()
    start = now - timedelta(minutes=1) - timedelta(hours=hours)
    make_attempt(
        JobFactory(team=team, state="succeeded"),
        state="ended",
        rented_at=start,
        registered_at=start,
        ended_at=now - timedelta(minutes=1),
        **H100_RATES,
    )


def zone_at_midday() -> str:
    """A time zone where it is around noon now, so the last half hour lies in its today."""
    offset = 12 - timezone.now().hour  # -11..12
    return f"Etc/GMT{-offset:+d}"  # POSIX sign: Etc/GMT-3 is UTC+3


def test_two_rents_planned_at_once_cannot_both_take_the_last_budget():
    team = TeamFactory()
    TeamBudgetFactory(team=team, daily_usd=Decimal("0.70"))  # room for one job
    jobs = [JobFactory(team=team, **STEPS_FOR_41_CENTS) for _ in range(2)]
    start = threading.Barrier(2)
    results: dict[int, bool] = {}

    def plan(job: Job) -> None:
        try:
            start.wait()
            with transaction.atomic():
                results[job.pk] = reserve_for_rent(job, now=timezone.now()).allowed
        finally:
            connection.close()

    threads = [threading.Thread(target=plan, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(results.values()) == [False, True]
    assert BudgetReservation.objects.count() == 1


@pytest.mark.slow
def test_a_worker_that_starts_enforces_the_limits_at_once(processes, tmp_path):
    team = TeamFactory(time_zone=zone_at_midday())
    TeamBudgetFactory(team=team, daily_usd=Decimal("0.50"))
    spent_today(team, hours=0.5)  # $0.86 today
    waiting = JobFactory(team=team, state="recovering")
    env = subprocess_env(NOMADGPU_VAR_DIR=str(tmp_path / "var"))  # its own broker: no beat

    processes.start("worker", celery_command("worker", "--pool=solo", "-l", "INFO"), env)

    try:
        wait_until(
            lambda: Job.objects.get(pk=waiting.pk).state == "paused_budget",
            timeout=90,
            what="the starting worker to pause the job over the daily limit",
        )
    except BaseException:
        print(processes.log("worker")[-3000:])
        raise
