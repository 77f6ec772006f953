"""Recovery anatomy: the agent's phase boundaries through the agent API, an interruption's
downtime split into phases (a plain function), and the split on the job and status pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.cache import cache
from django.urls import reverse

from agent.phases import PhaseClock
from jobs import anatomy
from jobs.models import Attempt, Interruption, JobState
from nomadgpu.models import Role
from tests.support.factories import (
    InterruptionFactory,
    JobFactory,
    MembershipFactory,
    TeamFactory,
    make_attempt,
)

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def call(client, token: str, name: str, body: dict):
    return client.post(
        f"/api/agent/{name}",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def beat(seq: int, step: int | None = None, **extra) -> dict:
    return {"seq": seq, "phase": "running", "step": step, "gpu": {"ok": True}, **extra}


# Boundaries of one recovery, seconds after the lost host's last heartbeat.
KNOWN = {
    "rented_at": at(50),
    "container_started_at": at(140),
    "deps_ready_at": at(150),
    "restore_downloaded_at": at(190),
    "restore_unpacked_at": at(193),
    "command_started_at": at(194),
    "running_at": at(194),
    "first_step_at": at(220),
}


def recovered(replacement: Attempt, **fields) -> Interruption:
    """An interruption (unsaved) detected 30 s after the last heartbeat, closed by REPLACEMENT."""
    fields = {
        "last_heartbeat_at": T,
        "detected_at": at(30),
        "replacement_rented_at": at(50),
        "running_again_at": at(194),
        "step_reached": 180,
        "resumed_step": 100,
        **fields,
    }
    return Interruption(cause="provider_gone", replacement=replacement, **fields)


# --- The agent API -------------------------------------------------------------------------


@pytest.mark.django_db
def test_register_keeps_when_the_container_came_up_and_the_dependencies_were_ready(client):
    attempt, token = make_attempt()

    with time_machine.travel(T, tick=False):
        phases = {"container_started": 40, "deps_ready": 10.5}
        response = call(client, token, "register", {"agent_version": "0.2", "phases": phases})
    attempt.refresh_from_db()

    assert response.status_code == 200
    assert attempt.container_started_at == T - timedelta(seconds=40)
    assert attempt.deps_ready_at == T - timedelta(seconds=10.5)


@pytest.mark.django_db
def test_register_from_an_agent_that_reports_no_phases_takes_its_first_call_for_both(client):
    attempt, token = make_attempt()

    with time_machine.travel(T, tick=False):
        call(client, token, "register", {"agent_version": "0.1.0"})
    with time_machine.travel(at(60), tick=False):
        call(client, token, "register", {"agent_version": "0.1.0"})  # restarted in place
    attempt.refresh_from_db()

    assert attempt.container_started_at == T
    assert attempt.deps_ready_at == T
    assert attempt.registered_at == T  # the GPU bills from the first registration


@pytest.mark.django_db
def test_register_and_heartbeat_keep_when_the_code_was_ready_and_the_setup_done(client):
    attempt, token = make_attempt()

    with time_machine.travel(at(100), tick=False):
        call(client, token, "register", {"agent_version": "1", "phases": {"workdir_ready": 4.0}})
    with time_machine.travel(at(130), tick=False):
        call(client, token, "heartbeat", beat(1, phases={"setup_done": 2.5, "workdir_ready": 0}))
    attempt.refresh_from_db()

    assert attempt.workdir_ready_at == at(96)  # the first report stands
    assert attempt.setup_done_at == at(127.5)


@pytest.mark.django_db
def test_heartbeat_phases_are_kept_from_their_first_report(client):
    attempt, token = make_attempt()
    first = {"restore_downloaded": 4, "restore_unpacked": 1, "command_started": 0.5}

    with time_machine.travel(T, tick=False):
        assert call(client, token, "heartbeat", beat(1, phases=first)).status_code == 200
    with time_machine.travel(at(30), tick=False):
        again = {"restore_downloaded": 1, "first_step": 2}
        assert call(client, token, "heartbeat", beat(2, 5, phases=again)).status_code == 200
    attempt.refresh_from_db()

    assert attempt.restore_downloaded_at == at(-4)
    assert attempt.restore_unpacked_at == at(-1)
    assert attempt.command_started_at == at(-0.5)
    assert attempt.first_step_at == at(28)


@pytest.mark.django_db
def test_a_heartbeat_with_implausible_phase_ages_is_answered_and_keeps_none_of_them(client):
    attempt, token = make_attempt()
    phases = {"first_step": -3, "restore_unpacked": 10**12, "made_up": 1}

    response = call(client, token, "heartbeat", beat(1, phases=phases))
    attempt.refresh_from_db()

    assert response.status_code == 200
    assert attempt.restore_unpacked_at is None
    assert attempt.first_step_at is None  # and no step yet, so no fallback either


@pytest.mark.django_db
def test_an_agent_without_phases_has_its_first_step_timed_by_the_first_beat_with_a_step(client):
    attempt, token = make_attempt()

    with time_machine.travel(T, tick=False):
        call(client, token, "heartbeat", beat(1))
    with time_machine.travel(at(15), tick=False):
        call(client, token, "heartbeat", beat(2, 3))
    with time_machine.travel(at(30), tick=False):
        call(client, token, "heartbeat", beat(3, 9))
    attempt.refresh_from_db()

    assert attempt.first_step_at == at(15)


@pytest.mark.django_db
def test_the_replacement_that_runs_again_is_kept_on_the_interruption(client):
    job = JobFactory(state=JobState.RECOVERING)
    lost, _ = make_attempt(job, number=1, state="ended")
    InterruptionFactory(attempt=lost, cause="provider_gone", detected_at=T)
    job.state = JobState.STARTING
    job.save(update_fields=["state"])
    replacement, token = make_attempt(job, number=2)

    call(client, token, "heartbeat", beat(1, phases={"command_started": 0}))

    assert Interruption.objects.get(attempt=lost).replacement == replacement


# --- The breakdown -------------------------------------------------------------------------


def test_a_recovery_with_every_boundary_known_splits_into_the_seven_phases():
    replacement = Attempt(pk=7, seconds_per_step=0.5, dph_base=0.9, **KNOWN)

    split = anatomy.breakdown(recovered(replacement))

    assert split["phases"] == {
        "detection": 30.0,
        "renting": 20.0,
        "provider_startup": 90.0,
        "agent_bootstrap": 10.0,
        "code": None,  # a job without code or setup (an older agent reports neither)
        "stage": None,
        "setup": None,
        "checkpoint_download": 40.0,
        "unpack": 4.0,  # 3 s after the last byte, and 1 s until the command started
        "first_step": 26.0,
    }
    assert split["total_s"] == 220.0
    assert split["lost_work"] == {"steps": 80, "gpu_s": 40.0, "usd": pytest.approx(0.01)}


def test_staged_model_files_are_the_model_download_phase_between_code_and_setup():
    # Code 5 s after the dependencies, the staged model 60 s later, setup 25 s after that.
    fields = {**KNOWN, "workdir_ready_at": at(155), "stage_done_at": at(215)}
    fields.update(setup_done_at=at(240), restore_downloaded_at=at(280))
    fields.update(restore_unpacked_at=at(283), command_started_at=at(284), first_step_at=at(310))
    replacement = Attempt(pk=7, seconds_per_step=0.5, dph_base=0.9, **fields)

    phases = anatomy.breakdown(recovered(replacement))["phases"]

    assert (phases["code"], phases["stage"], phases["setup"]) == (5.0, 60.0, 25.0)
    assert anatomy.PHASE_LABELS["stage"] == "Model download"


def test_a_setup_that_ended_before_the_model_download_counts_first_and_the_download_the_rest():
    # Setup ran beside the download (the agent's default): done 35 s after the code, the
    # staged files 25 s after that.
    fields = {**KNOWN, "workdir_ready_at": at(155), "stage_done_at": at(215)}
    fields.update(setup_done_at=at(190), restore_downloaded_at=at(216))
    fields.update(restore_unpacked_at=at(218), command_started_at=at(219), first_step_at=at(240))
    replacement = Attempt(pk=7, seconds_per_step=0.5, dph_base=0.9, **fields)

    split = anatomy.breakdown(recovered(replacement))

    assert (split["phases"]["setup"], split["phases"]["stage"]) == (35.0, 25.0)
    assert split["phases"]["checkpoint_download"] == 1.0
    assert sum(v for v in split["phases"].values() if v) == split["total_s"]


# A job with code and setup: fetched 5 s after the dependencies, set up in 25 s more.
WITH_SETUP = {**KNOWN, "workdir_ready_at": at(155), "setup_done_at": at(180)}
WITH_SETUP.update(restore_downloaded_at=at(220), restore_unpacked_at=at(223))
WITH_SETUP.update(command_started_at=at(224), running_at=at(224), first_step_at=at(250))


def test_code_and_setup_sit_between_the_agent_bootstrap_and_the_checkpoint_download():
    replacement = Attempt(pk=7, **WITH_SETUP)

    split = anatomy.breakdown(recovered(replacement))

    assert list(split["phases"]) == [key for key, _ in anatomy.PHASES]
    assert split["phases"]["agent_bootstrap"] == 10.0
    assert split["phases"]["code"] == 5.0
    assert split["phases"]["setup"] == 25.0
    assert split["phases"]["checkpoint_download"] == 40.0  # from setup done, not deps ready
    assert split["total_s"] == 250.0


def test_a_setup_without_code_counts_from_the_dependencies():
    replacement = Attempt(pk=7, **{**WITH_SETUP, "workdir_ready_at": None})

    phases = anatomy.breakdown(recovered(replacement))["phases"]

    assert phases["code"] is None
    assert phases["setup"] == 30.0
    assert sum(s for s in phases.values() if s is not None) == 250.0


def test_an_unknown_boundary_leaves_its_time_to_the_next_phase():
    old_agent = {**KNOWN, "restore_downloaded_at": None, "restore_unpacked_at": None}
    old_agent.update(command_started_at=None, container_started_at=None)
    replacement = Attempt(pk=7, **old_agent)

    phases = anatomy.breakdown(recovered(replacement))["phases"]

    assert phases["provider_startup"] is None
    assert phases["agent_bootstrap"] == 100.0 + 44.0  # rented → deps ready, then → running
    assert phases["checkpoint_download"] is None
    assert phases["unpack"] is None
    assert phases["first_step"] == 26.0
    assert sum(s for s in phases.values() if s is not None) == 220.0


def test_a_recovery_still_under_way_has_only_detection_and_renting():
    i = Interruption(
        cause="heartbeat_timeout", last_heartbeat_at=T, detected_at=at(26),
        replacement_rented_at=at(61), step_reached=40,
    )  # fmt: skip

    split = anatomy.breakdown(i)

    assert split["phases"]["detection"] == 26.0
    assert split["phases"]["renting"] == 35.0
    assert split["phases"]["first_step"] is None
    assert split["lost_work"] == {"steps": None, "gpu_s": None, "usd": None}


def test_segments_share_one_bar_in_phase_order_without_the_unknown():
    pieces = anatomy.segments({"renting": 30.0, "detection": 10.0, "unpack": None})

    assert [(p.key, p.percent, p.text) for p in pieces] == [
        ("detection", 25.0, "10 s"),
        ("renting", 75.0, "30 s"),
    ]


# --- The agent's side ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_agent_reports_the_bootstraps_moments_as_ages_until_they_are_delivered():
    clock = Clock()
    environ = {"NOMAD_CONTAINER_STARTED_AT": "1764417570", "NOMAD_DEPS_READY_AT": "1764417590"}
    phases = PhaseClock(environ, clock=clock, wall=lambda: 1764417600.0)

    clock.now += 5
    phases.mark("command_started")
    clock.now += 2

    assert phases.pending() == {"container_started": 37.0, "deps_ready": 17.0,
                                "command_started": 2.0}  # fmt: skip
    phases.delivered(["container_started", "deps_ready"])
    phases.mark("command_started")  # a second mark keeps the first moment
    assert phases.pending() == {"command_started": 2.0}


def test_without_the_bootstrap_the_agent_reports_its_own_start_as_dependencies_ready():
    clock = Clock()
    phases = PhaseClock({}, clock=clock, wall=lambda: 0.0)
    clock.now += 3

    assert phases.pending() == {"deps_ready": 3.0}


# --- The pages -------------------------------------------------------------------------------


def replaced_job(team, boundaries=KNOWN):
    job = JobFactory(team=team, state=JobState.RUNNING, name="zz-secret-job")
    lost, _ = make_attempt(job, number=1, state="ended", step=180)
    replacement, _ = make_attempt(
        job, number=2, state="running", seconds_per_step=0.5, dph_base=0.9, **boundaries
    )
    InterruptionFactory(
        attempt=lost, cause="provider_gone", last_heartbeat_at=T, detected_at=at(30),
        replacement_rented_at=at(50), running_again_at=at(194), step_reached=180,
        resumed_step=100, replacement=replacement,
    )  # fmt: skip
    return job


@pytest.mark.django_db
def test_the_job_page_shows_each_interruption_as_a_stacked_bar_with_the_lost_work(client):
    team = TeamFactory()
    member = MembershipFactory(team=team, role=Role.MEMBER).user
    job = replaced_job(team)
    client.force_login(member)

    html = client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert 'class="phase-track"' in html
    assert "Where the 3 min 40 s until training again went" in html
    assert "Provider start-up <strong>1 min 30 s</strong>" in html
    assert "Checkpoint download <strong>40 s</strong>" in html
    assert 'class="phase phase-detection" style="width:13.64%"' in html  # 30 of 220 s
    assert "80 steps redone, 40 s of GPU time, $0.01" in html


@pytest.mark.django_db
def test_the_job_page_and_status_json_show_the_code_and_setup_phases(client):
    cache.clear()
    team = TeamFactory(slug="setup-lab", time_zone="UTC", public_status_page=True)
    member = MembershipFactory(team=team, role=Role.MEMBER).user
    job = replaced_job(team, boundaries=WITH_SETUP)
    client.force_login(member)

    html = client.get(reverse("job-detail", args=[job.id])).content.decode()
    with time_machine.travel(at(3600), tick=False):
        phases = client.get("/status/setup-lab.json").json()["recovery_phases_s"]
    cache.clear()

    assert "Code <strong>5 s</strong>" in html
    assert "Setup <strong>25 s</strong>" in html
    assert 'class="phase phase-setup" style="width:10.00%"' in html  # 25 of 250 s
    assert phases["code"] == {"count": 1, "median": 5.0, "p90": 5.0}
    assert phases["setup"] == {"count": 1, "median": 25.0, "p90": 25.0}


@pytest.fixture
def public_team(db):
    cache.clear()
    team = TeamFactory(name="Anat Lab", slug="anat-lab", time_zone="UTC", public_status_page=True)
    replaced_job(team)
    yield team
    cache.clear()


def test_the_status_page_shows_the_phases_median_and_p90_without_job_details(client, public_team):
    with time_machine.travel(at(3600), tick=False):
        html = client.get("/status/anat-lab/").content.decode()

    assert 'id="phase-bar-median"' in html
    assert 'id="phase-bar-p90"' in html
    assert '<tr data-phase="provider_startup"><td>Provider start-up</td><td>1 min 30 s</td>' in html
    assert "zz-secret-job" not in html
    # Money appears only as the window's totals (tests/test_status_money.py), never beside an
    # incident or a phase.
    incidents = html[html.index('id="incidents-h"') :]
    phases = html[html.index('id="recovery-phases"') : html.index('id="daily-h"')]
    assert "$" not in incidents
    assert "$" not in phases


def test_the_status_json_carries_the_phases_since_version_2(client, public_team):
    with time_machine.travel(at(3600), tick=False):
        body = client.get("/status/anat-lab.json").json()

    assert body["version"] == 3
    assert body["detection_s"] == {"count": 1, "median": 30.0, "p90": 30.0}  # version 1 kept
    phases = body["recovery_phases_s"]
    assert list(phases) == [key for key, _ in anatomy.PHASES]
    assert phases["checkpoint_download"] == {"count": 1, "median": 40.0, "p90": 40.0}
    assert phases["first_step"] == {"count": 1, "median": 26.0, "p90": 26.0}
