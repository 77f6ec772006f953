"""A worker killed mid-rent: the claim it held is settled at once, and the job trains again soon
after a worker is back, with never two instances for it.

The renting worker is a real process (prefork, as the Procfile starts it), SIGKILLed with its
pool while its rent is claimed but no create was sent: the sandbox answers 429 for a few
seconds (Vast's rate limit), so the rent sits in its offer search. The watchdog runs in this
process on its own queue, as ``make run`` runs it in a process of its own.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from jobs.models import Attempt, JobState
from jobs.tasks import watchdog_tick
from nomadgpu.celery import app
from tests.e2e.stack import kill_group, supervisor_env, worker_process
from tests.support.factories import TeamFactory, UserFactory
from tests.support.instances import InstanceWatch
from tests.support.processes import wait_until
from tests.support.supervisor import Supervisor, beating, point_at_sandbox
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT = toy_env(steps=100, every=20, step_seconds=0.04)
BACK_TRAINING_GOAL_S = 60  # issue: training again within 60 s of a worker coming back


@pytest.fixture
def watchdog_only(settings, sandbox, live_server, tmp_path):
    """Web (live server), the watchdog's worker (its queue only) and beat in this process."""
    settings.SITE_URL = live_server.url
    point_at_sandbox(settings, sandbox, tmp_path)
    app.control.purge()
    with (
        start_worker(
            app, pool="solo", queues=["watchdog"], perform_ping_check=False, shutdown_timeout=10
        ),
        beating(watchdog_tick),
    ):
        yield Supervisor(sandbox, TeamFactory(slug="e2e"), UserFactory(username="e2e"))


def claimed_before_create(job) -> Attempt | None:
    return job.attempts.filter(
        state="requested", create_sent_at=None, rent_claimed_by__gt=""
    ).first()


def test_a_worker_killed_after_claiming_a_rent_leaves_no_job_without_a_host(
    watchdog_only, settings, processes
):
    supervisor = watchdog_only
    env = supervisor_env(settings)
    first_worker = worker_process(processes, env, name="worker-1@e2e")
    supervisor.sandbox.anon().post(
        "/sandbox/inject", json={"action": "ratelimit", "arg": 6}
    ).raise_for_status()

    with InstanceWatch(supervisor.sandbox) as watch:
        job = supervisor.submit_toy(env=SHORT, total_steps=100)
        claimed = wait_until(
            lambda: claimed_before_create(job), timeout=60, what="the worker to claim the rent"
        )
        killed_at = timezone.now()
        kill_group(first_worker)

        wait_until(
            lambda: Attempt.objects.get(pk=claimed.pk).state == "ended",
            timeout=30,
            what="the dead worker's claim to be settled",
        )
        claimed.refresh_from_db()
        assert claimed.end_reason == "rent_interrupted"
        assert claimed.ended_at - killed_at < timedelta(seconds=5)  # a tick or two, not 300 s
        assert job.events.filter(kind="rent_interrupted").count() == 1

        worker_process(processes, env, name="worker-2@e2e")
        back_at = timezone.now()
        try:
            running = wait_running(job, timeout=BACK_TRAINING_GOAL_S + 30)
        except BaseException:
            print(processes.log("worker-2@e2e")[-3000:])
            raise
        assert running.running_at - back_at <= timedelta(seconds=BACK_TRAINING_GOAL_S)
        settled_s = (claimed.ended_at - killed_at).total_seconds()
        back_s = (running.running_at - back_at).total_seconds()
        print(f"worker killed mid-rent: claim settled {settled_s:.1f} s after the kill, "
              f"training {back_s:.1f} s after a worker came back")  # fmt: skip
        wait_state(job, JobState.SUCCEEDED, timeout=90)

    assert job.attempts.count() == 2
    assert len(watch.ids_for(job)) == 1  # the killed rent never made an instance
    assert watch.peak_for(job) == 1
    last = job.attempts.get(number=2)
    assert f"final-digest: {toy_digest(SHORT)}" in last.log_tail
