"""The supervisor's own outage is never a host loss: a web restart and a database outage with
jobs training, and a host that truly froze during one.

The web runs as a real process here (``manage.py runserver``, as ``make run`` runs it), so it can
be stopped and started again on its port; the sandbox keeps saying every host runs, as Vast
would. Heartbeats come every second (a 1.75 s timeout): each outage below lasts several
timeouts.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from jobs.models import Attempt, Interruption, JobState
from jobs.tasks import watchdog_tick
from jobs.watchdog.passes import WATCHDOG
from nomadgpu import ingest
from nomadgpu.celery import app
from nomadgpu.models import IngestOutage, ServiceHeartbeat
from tests.e2e.stack import WebProcess, supervisor_env, worker_process
from tests.support.factories import TeamFactory, UserFactory
from tests.support.instances import InstanceWatch
from tests.support.processes import database_url_of_test_db, wait_until
from tests.support.supervisor import Supervisor, beating, point_at_sandbox
from tests.support.tcp_proxy import TcpProxy
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_checkpoint, wait_interruption, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TRAINING = toy_env(steps=600, every=50, step_seconds=0.05)  # ~30 s of training
OUTAGE_TIMEOUTS = 5  # an outage lasts this many heartbeat timeouts at least
TIMEOUT_S = 1.75  # 1 s beats


@pytest.fixture
def stack_settings(settings, sandbox, tmp_path):
    point_at_sandbox(settings, sandbox, tmp_path)
    settings.WEB_BEACON_INTERVAL_S = 0.2  # well under the 1 s beats (README)
    return settings


@pytest.fixture
def beat():
    with beating(watchdog_tick):
        yield


@pytest.fixture
def web_stack(stack_settings, sandbox, processes, celery_worker_thread, beat):
    """The web as a process of its own; worker and beat in this process (they keep running)."""
    web = WebProcess(processes, {})
    stack_settings.SITE_URL = web.url
    web.env = supervisor_env(stack_settings)
    web.start()
    team = TeamFactory(slug="e2e", public_status_page=True)
    return web, Supervisor(sandbox, team, UserFactory(username="e2e"))


def submit(supervisor: Supervisor):
    return supervisor.submit_toy(env=TRAINING, total_steps=int(TRAINING["TOY_STEPS"]))


def all_silent_for(jobs, seconds: float) -> bool:
    """Every job's live attempt has stored no beat for SECONDS."""
    cutoff = timezone.now() - timedelta(seconds=seconds)
    live = Attempt.objects.filter(job__in=jobs, state__in=["starting", "running"])
    return live.count() == len(jobs) and not live.filter(last_heartbeat_at__gt=cutoff).exists()


def training(jobs) -> None:
    for job in jobs:
        wait_running(job, 1)
        wait_checkpoint(job)


def outage_over(down_at, up_at) -> IngestOutage:
    """The one recorded outage spanning DOWN_AT..UP_AT (the one the test caused). Under load a
    late beat can hold a loss for a moment outside it too (the rule erring the safe way), so
    the others are not counted here."""
    spanning = IngestOutage.objects.filter(started_at__lte=down_at, ended_at__gte=up_at)
    assert spanning.count() == 1, list(IngestOutage.objects.values())
    return spanning.get()


def cut_lasted(down_at, up_at) -> float:
    """Seconds the test kept ingest down, which the outage recorded must span. The wait made
    every agent silent for several timeouts, counted from its last beat: on a loaded machine
    that beat can come more than an interval before the cut, so the cut itself is shorter."""
    return (up_at - down_at).total_seconds()


class StoredMoments:
    """Reads, every 20 ms in a thread, the beats stored for ATTEMPT_ID, the web's beacons and
    the start of each watchdog pass (their ``ServiceHeartbeat``s): what a pass could know, and
    when passes ran."""

    def __init__(self, attempt_id: int) -> None:
        self.attempt_id = attempt_id
        self.beats: set = set()
        self.passes: set = set()
        self.beacons: set = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            while not self.stop.wait(0.02):
                beat = Attempt.objects.filter(pk=self.attempt_id).values_list(
                    "last_heartbeat_at", flat=True
                )
                self.beats.update(b for b in beat if b is not None)
                services = ServiceHeartbeat.objects.filter(name__in=(WATCHDOG, ingest.WEB))
                for name, seen in services.values_list("name", "last_seen_at"):
                    (self.passes if name == WATCHDOG else self.beacons).add(seen)
        finally:
            connection.close()

    def beacon_fresh_at(self, moment) -> bool:
        """Whether a pass starting at MOMENT could see a beacon no older than the outage gap
        (``silence.beacon_late``); one written just after MOMENT counts, as a pass reads the
        beacon a little after it starts."""
        late = moment - ingest.gap()
        return any(late <= b <= moment + timedelta(seconds=0.5) for b in self.beacons)

    def __enter__(self) -> StoredMoments:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def status_page(web: WebProcess) -> str:
    return httpx.get(f"{web.url}/status/e2e/", timeout=10).raise_for_status().text


def test_a_web_restart_with_jobs_training_loses_no_host(web_stack):
    web, supervisor = web_stack
    with InstanceWatch(supervisor.sandbox) as watch:
        jobs = [submit(supervisor), submit(supervisor)]
        training(jobs)

        web.stop()
        down_at = timezone.now()
        wait_until(
            lambda: all_silent_for(jobs, OUTAGE_TIMEOUTS * TIMEOUT_S),
            timeout=60,
            what="every agent to be silent for several heartbeat timeouts",
        )
        held = IngestOutage.objects.filter(ended_at=None).first()
        assert held is not None  # the watchdog saw it, and waited
        assert held.cause == "web_down"
        up_at = timezone.now()
        web.start()

        for job in jobs:
            wait_state(job, JobState.SUCCEEDED, timeout=120)

    assert not Interruption.objects.exists()
    for job in jobs:
        assert job.attempts.count() == 1
        assert watch.peak_for(job) == 1
        assert len(watch.ids_for(job)) == 1
        last = job.attempts.get()
        assert f"final-digest: {toy_digest(TRAINING)}" in last.log_tail
    outage = outage_over(down_at, up_at)
    seconds = (outage.ended_at - outage.started_at).total_seconds()
    assert seconds >= cut_lasted(down_at, up_at)
    page = status_page(web)
    assert f"agent API unreachable for {seconds:.0f} s; no job was declared lost" in page


def test_a_host_that_froze_during_an_outage_is_found_once_ingest_returns(web_stack):
    web, supervisor = web_stack
    frozen_job, healthy_job = submit(supervisor), submit(supervisor)
    training([frozen_job, healthy_job])
    frozen = frozen_job.attempts.get(number=1)
    healthy = healthy_job.attempts.get(number=1)
    interval = timedelta(seconds=frozen_job.heartbeat_interval_s)

    with StoredMoments(healthy.pk) as stored:
        web.stop()
        down_at = timezone.now()
        supervisor.sandbox.inject(frozen.instance_id, "freeze")  # really gone, not just unheard
        wait_until(
            lambda: all_silent_for([frozen_job, healthy_job], OUTAGE_TIMEOUTS * TIMEOUT_S),
            timeout=60,
            what="every agent to be silent for several heartbeat timeouts",
        )
        up_at = timezone.now()
        web.start()
        lost = wait_interruption(frozen, timeout=60)
    outage = outage_over(down_at, up_at)
    assert lost.cause == "heartbeat_timeout"
    # Its silence is counted from the moment ingest worked again (the newest outage that ended
    # before the pass: under load a late beacon can record a short one after the test's own),
    # plus the one interval a backing-off agent gets to retry (``jobs.watchdog.silence``): never
    # a loss before that plus its usual timeout.
    ended = IngestOutage.objects.filter(ended_at__lte=lost.detected_at).order_by("-ended_at")
    counted_from = ended.values_list("ended_at", flat=True).first() + interval
    assert counted_from >= outage.ended_at + interval
    assert lost.detected_at >= counted_from + timedelta(seconds=TIMEOUT_S)
    # And found as soon as the rule allows: once that timeout passed and the healthy agent's
    # beat, stored after the frozen one's next beat was due, proves the path works. Passes
    # that saw the web's beacon late are held by the rule (the outage's end may not be known
    # yet). The pass that finds it is the first other to start after both, or the next one (a
    # beat stored with an earlier time can commit after a pass read the beats). Measured,
    # not a fixed allowance: on a loaded machine the healthy agent's first beats after the
    # outage, the beacon and the passes all come late.
    proof = min(b for b in stored.beats if b >= counted_from + interval)
    allowed_at = max(counted_from + timedelta(seconds=TIMEOUT_S), proof)
    passes_after = sorted(
        t
        for t in stored.passes | {lost.detected_at}
        if t >= allowed_at and (t == lost.detected_at or stored.beacon_fresh_at(t))
    )
    assert lost.detected_at in passes_after[:2], (
        f"allowed at {allowed_at}, lost at {lost.detected_at}, passes {passes_after[:3]}, "
        f"outages {list(IngestOutage.objects.values('cause', 'started_at', 'ended_at'))}"
    )
    after_return = (lost.detected_at - outage.ended_at).total_seconds()
    print(
        f"frozen during the outage: lost {after_return:.2f} s after ingest returned; the rule "
        f"allowed it at {(allowed_at - outage.ended_at).total_seconds():.2f} s"
    )
    wait_state(healthy_job, JobState.SUCCEEDED, timeout=120)
    wait_state(frozen_job, JobState.SUCCEEDED, timeout=120)
    assert healthy_job.attempts.count() == 1
    assert not Interruption.objects.filter(job=healthy_job).exists()
    assert Interruption.objects.count() == 1
    supervisor.sandbox.inject(frozen.instance_id, "thaw")  # lets the sandbox reap it


def lost_and_outages(down_at, up_at) -> str:
    """What a failing outage test needs to be read: the losses and the outages recorded."""
    lost = Interruption.objects.values(
        "job_id", "cause", "detail", "last_heartbeat_at", "detected_at"
    )
    outages = IngestOutage.objects.values("cause", "started_at", "ended_at")
    return f"cut {down_at}..{up_at}; lost {list(lost)}; outages {list(outages)}"


def proxied(url: str, port: int) -> str:
    """URL (a PostgreSQL URL on 127.0.0.1:5432) through the proxy on PORT instead."""
    return url.replace(f":{connection.settings_dict['PORT'] or 5432}/", f":{port}/", 1)


@pytest.mark.needs_postgres
def test_a_database_outage_with_jobs_training_loses_no_host(
    stack_settings, sandbox, processes, beat
):
    # Every supervisor process reaches PostgreSQL through a proxy that the test cuts, as a
    # database restart does: the web, the worker and the watchdog all lose it at once.
    db = connection.settings_dict
    proxy = TcpProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    app.control.purge()
    web = WebProcess(processes, {})
    stack_settings.SITE_URL = web.url
    env = supervisor_env(
        stack_settings, DATABASE_URL=proxied(database_url_of_test_db(), proxy.port)
    )
    web.env = env
    web.start()
    worker_process(processes, env, name="worker@outage", queues="celery,watchdog")
    supervisor = Supervisor(sandbox, TeamFactory(slug="e2e"), UserFactory(username="e2e"))
    try:
        with InstanceWatch(sandbox) as watch:
            jobs = [submit(supervisor), submit(supervisor)]
            training(jobs)

            proxy.cut()
            down_at = timezone.now()
            wait_until(
                lambda: all_silent_for(jobs, OUTAGE_TIMEOUTS * TIMEOUT_S),
                timeout=60,
                what="every agent to be silent for several heartbeat timeouts",
            )
            up_at = timezone.now()
            proxy.restore()

            for job in jobs:
                wait_state(job, JobState.SUCCEEDED, timeout=120)
    except BaseException:
        print(processes.log("worker@outage")[-4000:])
        print(web.log()[-4000:])
        raise
    finally:
        proxy.close()

    assert not Interruption.objects.exists(), lost_and_outages(down_at, up_at)
    for job in jobs:
        assert job.attempts.count() == 1
        assert watch.peak_for(job) == 1
    outage = outage_over(down_at, up_at)  # nothing could run meanwhile: the web recorded it
    assert (outage.ended_at - outage.started_at).total_seconds() >= cut_lasted(down_at, up_at)
