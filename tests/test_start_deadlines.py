"""Start deadlines through the supervisor: a host rented on the sandbox whose image pull hangs
is abandoned at the deadline its bytes and link give (the watchdog's pass driven at known
moments), long before the start timeout; the job page and the member API show that deadline
and why; an agent that registers and then stops moving bytes in its restore is lost with the
phase named. The decisions themselves are tests/test_start_deadline.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from hosts.vast import VastClient
from jobs import lifecycle
from jobs.models import Attempt, Interruption, Job, JobState
from jobs.rent_decision import RentDecision
from jobs.renting import rent
from jobs.watchdog import passes, poll, start_due
from jobs.watchdog import start_deadline as sd
from nomadgpu import api_tokens
from nomadgpu.humanize import duration
from tests.support.agent_api import call
from tests.support.factories import JobFactory, make_attempt
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db

GIB, MB = 1024**3, 1024**2


@pytest.fixture
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


def rented(box, settings, team) -> Attempt:
    """A job of TEAM rented on BOX through the real rent path (its decision stored); its agent
    never registers here (nothing serves the agent API)."""
    settings.VAST_URL, settings.VAST_API_KEY = box.url, DEFAULT_KEY
    job = JobFactory(team=team, total_steps=3000, requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, box.url) as client:
        assert rent.rent(attempt.pk, now=now, client=client) == "rented"
    attempt.refresh_from_db()
    return attempt


def tick(at) -> dict:
    return passes.tick(now=at, poll_provider=False)


def test_a_sandbox_instance_stuck_loading_stays_loading_with_its_pull_frozen(sandbox):
    asks = [o["id"] for o in sandbox.search({"rentable": {"eq": True}, "limit": 2})]
    stuck, control = (sandbox.create(ask) for ask in asks)
    sandbox.inject(stuck, "stuck-loading")

    sandbox.wait_status(control, "running")  # every phase of the stuck one would have run out

    shown = sandbox.client().get(f"/api/v0/instances/{stuck}/").json()["instances"]
    assert shown["actual_status"] == "loading"
    assert "Downloading" in shown["status_msg"]
    debug = sandbox.debug(stuck)
    assert debug["billing_now"] == ["disk"]  # loading: no GPU billed
    assert "image pull stuck" in [e["kind"] for e in debug["events"]]


@pytest.mark.usefixtures("no_worker")
def test_a_host_whose_pull_hangs_is_abandoned_at_its_bytes_deadline_not_the_start_timeout(
    sandbox, settings, cast, client
):
    attempt = rented(sandbox, settings, cast.team_a)
    sandbox.inject(attempt.instance_id, "stuck-loading")
    rented_at, mbps = attempt.rented_at, RentDecision.of(attempt).download_mbps
    pull = 5.0 * GIB * 8 / (mbps * 1e6) * sd.ADVERTISED_MARGIN  # the profile's 5 GB default
    expected = rented_at + timedelta(seconds=sd.VAST_START_S + pull + sd.AGENT_START_S)

    tick(rented_at + timedelta(seconds=1))  # the first look sets the deadline
    poll.poll_providers(rented_at + timedelta(seconds=2))  # Vast says loading: nothing later
    attempt.refresh_from_db()

    assert attempt.provider_status == "loading"
    assert attempt.start_due_at == pytest.approx(expected, abs=timedelta(milliseconds=1))
    assert attempt.heartbeat_deadline == attempt.start_due_at
    due_s = (attempt.start_due_at - rented_at).total_seconds()
    assert due_s < attempt.job.start_timeout_s  # the 1200 s cap is not what judges it

    # The job page and the member API show the deadline and why, from one function.
    client.force_login(cast.member)
    with time_machine.travel(rented_at + timedelta(seconds=60), tick=False):
        page = client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()
        _, token = api_tokens.create_token(user=cast.member, name="t", now=timezone.now())
        shown = client.get(
            f"/api/jobs/{attempt.job_id}", HTTP_AUTHORIZATION=f"Bearer {token}"
        ).json()["start_deadline"]
    assert shown["waiting_for"] == "the host's agent"
    assert f"pull of 5.0 GB at {mbps:,.0f} Mbit/s advertised" in shown["why"]
    assert shown["text"] == f"{shown['why']}: due in {duration(due_s - 60)}"
    assert shown["text"] in page.replace("&#x27;", "'")

    tick(attempt.start_due_at - timedelta(seconds=1))
    assert Attempt.objects.get(pk=attempt.pk).state == "starting"  # never before

    tick(attempt.start_due_at + timedelta(seconds=1))

    lost = Interruption.objects.get(attempt=attempt)
    assert lost.cause == "start_overdue"
    assert lost.detail.startswith(f"not running {round(due_s + 1)} s after rent: Vast's start")
    assert f"pull of 5.0 GB at {mbps:,.0f} Mbit/s advertised" in lost.detail
    job = Job.objects.get(pk=attempt.job_id)
    assert job.avoid_machine_ids == [attempt.machine_id]
    assert job.attempts.filter(number=2, state="planned").exists()  # replaced in the same pass


@pytest.mark.usefixtures("no_worker")
def test_the_start_timeout_stays_the_outer_cap(sandbox, settings, cast):
    attempt = rented(sandbox, settings, cast.team_a)
    Job.objects.filter(pk=attempt.job_id).update(start_timeout_s=90)  # under Vast's 300 s
    attempt.refresh_from_db()

    tick(attempt.rented_at + timedelta(seconds=1))
    attempt.refresh_from_db()
    assert attempt.start_due_at == attempt.rented_at + timedelta(seconds=90)
    tick(attempt.rented_at + timedelta(seconds=91))

    lost = Interruption.objects.get(attempt=attempt)
    assert lost.cause == "never_registered"
    assert lost.detail.startswith("no agent within 90 s")


@pytest.mark.usefixtures("no_worker")
def test_vasts_running_pushes_the_deadline_to_the_agents_start(sandbox, settings, cast):
    attempt = rented(sandbox, settings, cast.team_a)
    late = attempt.rented_at + timedelta(seconds=500)  # past the rent-time deadline
    tick(attempt.rented_at + timedelta(seconds=1))
    attempt.refresh_from_db()
    Attempt.objects.filter(pk=attempt.pk).update(provider_status="loading")
    attempt.refresh_from_db()

    start_due.note_provider_news(attempt, "running", "", now=late)

    attempt.refresh_from_db()
    assert attempt.start_due_at == late + timedelta(seconds=sd.AGENT_START_S)
    assert attempt.start_due_why == "running seen: agent start"
    tick(late + timedelta(seconds=30))
    assert not Interruption.objects.filter(attempt=attempt).exists()


# ---- after register: the early phases --------------------------------------------------------


def restoring(seq: int, done: int, total: int = 600 * MB, **extra) -> dict:
    progress = {"restore": {"bytes_done": done, "bytes_total": total, "done": False}}
    return {
        "seq": seq,
        "phase": "restoring",
        "gpu": {"ok": True},
        "phase_progress": progress,
        **extra,
    }


@pytest.fixture
def registered(client):
    """A rented attempt whose stub agent registered at T0 (15 s heartbeats, an offer that
    advertised 1,000 Mbit/s)."""
    t0 = timezone.now().replace(microsecond=0)
    job = JobFactory(heartbeat_interval_s=15, state="starting")
    decision = {"chosen": {"offer": {"inet_down_mbps": 1000.0}}}
    attempt, token = make_attempt(
        job, instance_id=41, machine_id=77, rented_at=t0 - timedelta(seconds=90), decision=decision
    )
    with time_machine.travel(t0, tick=False):
        assert call(client, token, "register", {"agent_version": "0.1"}).status_code == 200
    return attempt, token, t0


def beat_at(client, token, moment, body) -> None:
    with time_machine.travel(moment, tick=False):
        response = call(client, token, "heartbeat", body)
    assert response.status_code == 200, response.content


@pytest.mark.usefixtures("no_worker")
def test_an_agent_that_stops_moving_in_restore_is_lost_with_the_phase_named(client, registered):
    attempt, token, t0 = registered

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    beat_at(client, token, at(0), restoring(1, 0))
    beat_at(client, token, at(29), restoring(2, 290 * MB))  # ~84 Mbit/s measured
    for seq, second in enumerate((44, 59, 74, 89), start=3):  # beating, no byte moves
        beat_at(client, token, at(second), restoring(seq, 290 * MB))
    attempt.refresh_from_db()

    assert attempt.start_due_at == at(29 + 60)  # 310 MB at 84 Mbit/s x 1.5 = 46 s: the floor
    assert attempt.start_due_why.startswith("restore: 310 MB left at 84 Mbit/s measured")
    assert attempt.heartbeat_deadline == attempt.start_due_at
    assert attempt.link_mbps == pytest.approx(290 * MB * 8 / 29 / 1e6)

    tick(at(88))
    assert Attempt.objects.get(pk=attempt.pk).state == "starting"  # never before
    tick(at(90))

    lost = Interruption.objects.get(attempt=attempt)
    assert lost.cause == "start_stalled"
    assert lost.detail == "stalled in restore: 0 bytes in 61 s, 310 MB left at 84 Mbit/s measured"
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == JobState.RENTING  # recovering, and its replacement planned in the pass
    assert job.attempts.filter(number=2, state="planned").exists()


@pytest.mark.usefixtures("no_worker")
def test_a_restore_that_keeps_moving_is_never_lost(client, registered):
    attempt, token, t0 = registered

    for seq, second in enumerate(range(0, 600, 15), start=1):  # 1 MB per beat: slow, moving
        beat_at(client, token, t0 + timedelta(seconds=second), restoring(seq, seq * MB))
        tick(t0 + timedelta(seconds=second + 1))

    assert not Interruption.objects.filter(attempt=attempt).exists()
    attempt.refresh_from_db()
    assert attempt.start_due_at > t0 + timedelta(seconds=600)


@pytest.mark.usefixtures("no_worker")
def test_an_older_agent_that_sends_no_bytes_is_judged_as_before(client, registered):
    attempt, token, t0 = registered
    old = {"phase": "restoring", "gpu": {"ok": True}}

    for seq, second in enumerate(range(0, 600, 15), start=1):
        beat_at(client, token, t0 + timedelta(seconds=second), {"seq": seq, **old})
        tick(t0 + timedelta(seconds=second + 1))

    attempt.refresh_from_db()
    assert attempt.state == "starting"
    assert attempt.start_due_at is None
    assert not Interruption.objects.filter(attempt=attempt).exists()


def test_the_phase_bytes_are_validated(client, registered):
    _, token, _ = registered
    negative = restoring(1, -1)
    unknown_phase = {**restoring(2, 5), "phase_progress": {"compile": {"bytes_done": 1}}}

    assert call(client, token, "heartbeat", negative).status_code == 422
    assert call(client, token, "heartbeat", unknown_phase).status_code == 200
