"""One definition of "back": a recovery's two figures (``jobs.recovery_times``), from the loss
(the lost host's last heartbeat) to the replacement running ("back on a machine") and to the
first training step after the loss ("training again"), reached through the agent API and read
the same from every surface: job page, member API, CLI, status page and its JSON, badge, feed,
notification and admin. And the timeline's words agree with what happened."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from jobs import anatomy, lifecycle
from jobs.models import Attempt, Interruption, Job, JobState
from jobs.recovery_times import recovery_times
from nomadgpu import api_tokens
from nomadgpu.models import Team
from nomadgpu_cli import cli
from nomadgpu_cli.drill import drill_summary
from notify import messages
from tests.support.factories import InterruptionFactory, JobFactory, make_attempt

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
BACK_S, TRAINING_S = 46, 74  # the field report's drill: back on a machine, training again
BACK, TRAINING = "46 s", "1 min 14 s"  # as every surface writes them (nomadgpu.humanize)


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def heartbeat(
    client, token: str, seq: int, *, step: int | None, phase: str = "running", phases=None
):
    body = {"seq": seq, "phase": phase, "step": step, "total_steps": 300, "gpu": {"ok": True}}
    if phases is not None:  # phase boundaries, seconds before this beat (PhasesIn)
        body["phases"] = phases
    response = client.post(
        "/api/agent/heartbeat",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.content


def recover(client, team: Team) -> Job:
    """A job whose host beat last at T (step 40) and was found lost 30 s later; its replacement,
    rented at +35 s, reports the training command running at +46 s and its first step at +74 s,
    all through the agent API."""
    job = JobFactory(team=team, state=JobState.RUNNING, name="drilled", total_steps=300)
    lost, lost_token = make_attempt(job, state="running", instance_id=701, step=39)
    with time_machine.travel(T, tick=False):
        heartbeat(client, lost_token, 1, step=40)
    with time_machine.travel(at(30), tick=False):
        lifecycle.handle_loss(lifecycle.Loss(lost.pk, "provider_gone"), now=timezone.now())
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)  # rented, as renting does
    _, token = make_attempt(
        job, number=2, instance_id=702, rented_at=at(35), resumed_from_step=40, dph_base=0.4
    )
    with time_machine.travel(at(BACK_S), tick=False):
        heartbeat(client, token, 1, step=None)  # the command runs: back on a machine
    with time_machine.travel(at(60), tick=False):
        heartbeat(client, token, 2, step=None)  # still loading
    with time_machine.travel(at(TRAINING_S), tick=False):
        heartbeat(client, token, 3, step=41)  # the first step: training again
    return job


@pytest.fixture
def public_team(db):
    cache.clear()
    yield Team.objects.create(name="Back Lab", slug="back-lab", public_status_page=True)
    cache.clear()


# --- The definitions ----------------------------------------------------------------------------


def test_both_figures_count_from_the_last_heartbeat_else_from_the_detection():
    heard = Interruption(
        last_heartbeat_at=T, detected_at=at(30), running_again_at=at(46), training_again_at=at(74)
    )
    never_heard = Interruption(detected_at=at(30), running_again_at=at(46))

    assert (recovery_times(heard).back_on_machine_s, recovery_times(heard).training_again_s) == (
        46.0,
        74.0,
    )
    assert recovery_times(never_heard).lost_at == at(30)
    assert recovery_times(never_heard).back_on_machine_s == 16.0
    assert recovery_times(never_heard).training_again_s is None  # no first step yet


@pytest.mark.django_db
def test_the_replacement_running_is_back_on_a_machine_and_its_first_step_training_again(
    client, public_team
):
    job = recover(client, public_team)

    row = Interruption.objects.select_related("replacement").get(job=job)
    times = recovery_times(row)
    assert (times.back_on_machine_s, times.training_again_s) == (BACK_S, TRAINING_S)
    assert row.training_again_at == row.replacement.first_step_at == at(TRAINING_S)
    # The anatomy's phases add up to "training again", exactly.
    split = anatomy.breakdown(row)
    assert split["total_s"] == TRAINING_S
    assert sum(s for s in split["phases"].values() if s is not None) == TRAINING_S
    back = job.events.get(kind="back_on_machine")
    again = job.events.get(kind="running_again")
    assert back.message.startswith(f"back on a machine after {BACK}: the training command")
    assert again.message == (
        f"training again after {TRAINING} (back on a machine after {BACK}), resumed from step 40"
    )
    assert (again.created_at, again.data["training_again_s"]) == (at(TRAINING_S), TRAINING_S)


def replacement_starting(team: Team):
    """A job whose host beat last at T and was found lost at +20 s, and its replacement
    starting: (the job, the lost attempt, the replacement's agent token)."""
    job = JobFactory(team=team, state=JobState.RECOVERING)
    lost, _ = make_attempt(job, state="ended")
    InterruptionFactory(attempt=lost, last_heartbeat_at=T, detected_at=at(20))
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)
    _, token = make_attempt(job, number=2)
    return job, lost, token


@pytest.mark.django_db
def test_a_first_step_in_the_beat_that_reports_running_is_both_at_once(client, cast):
    job, lost, token = replacement_starting(cast.team_a)

    with time_machine.travel(at(50), tick=False):
        heartbeat(client, token, 1, step=3)  # a fast script: running, and already stepping

    times = recovery_times(Interruption.objects.get(attempt=lost))
    assert (times.back_on_machine_s, times.training_again_s) == (50.0, 50.0)
    assert job.events.filter(kind="running_again").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("phases", "back_s", "training_s"),
    [
        # The agent dates both: its command started 8 s and its first step 5 s before a beat
        # that arrived late (a loaded portal): both figures from its own clock.
        ({"command_started": 8.0, "first_step": 5.0}, 52.0, 55.0),
        # An agent that dates its first step only: "back" is the beat's arrival, and training
        # again is never before it (seen under load: back 4.64 s, training again 4.41 s).
        ({"first_step": 5.0}, 60.0, 60.0),
    ],
)
def test_a_late_beat_never_dates_back_on_a_machine_after_training_again(
    client, cast, phases, back_s, training_s
):
    _, lost, token = replacement_starting(cast.team_a)

    with time_machine.travel(at(60), tick=False):
        heartbeat(client, token, 1, step=3, phases=phases)

    times = recovery_times(Interruption.objects.get(attempt=lost))
    assert (times.back_on_machine_s, times.training_again_s) == (back_s, training_s)


@pytest.mark.django_db
def test_a_replacement_lost_before_its_first_step_leaves_training_again_to_the_next(client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.STARTING)
    first, _ = make_attempt(job, state="ended")
    InterruptionFactory(attempt=first, last_heartbeat_at=T, detected_at=at(20))
    second, token = make_attempt(job, number=2, instance_id=802)
    with time_machine.travel(at(40), tick=False):
        heartbeat(client, token, 1, step=None)  # back on a machine...
        lifecycle.handle_loss(lifecycle.Loss(second.pk, "provider_gone"), now=at(45))  # ...lost
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)
    _, token = make_attempt(job, number=3, instance_id=803, resumed_from_step=10)
    with time_machine.travel(at(100), tick=False):
        heartbeat(client, token, 1, step=None)
    with time_machine.travel(at(130), tick=False):
        heartbeat(client, token, 2, step=11)

    rows = Interruption.objects.select_related("replacement").order_by("detected_at")
    assert [(r.attempt.number, r.replacement.number) for r in rows] == [(1, 3), (2, 3)]
    first_loss = recovery_times(rows[0])
    assert (first_loss.back_on_machine_s, first_loss.training_again_s) == (40.0, 130.0)
    assert anatomy.breakdown(rows[0])["total_s"] == 130.0
    assert job.events.filter(kind="running_again").count() == 1


@pytest.mark.django_db
def test_a_row_recorded_before_replacements_were_kept_is_not_taken_by_a_later_host(client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.STARTING)
    old, _ = make_attempt(job, state="ended")
    InterruptionFactory(attempt=old, detected_at=at(0), running_again_at=at(40), resumed_step=5)
    _, token = make_attempt(job, number=2, instance_id=804)

    with time_machine.travel(at(900), tick=False):
        heartbeat(client, token, 1, step=7)  # a later host: running and stepping

    row = Interruption.objects.get(attempt=old)
    assert (row.replacement_id, row.training_again_at, row.resumed_step) == (None, None, 5)


# --- Every surface ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_surface_shows_the_same_two_figures(client, cast, public_team):
    job = recover(client, public_team)
    team_admin = cast.admin
    team_admin.memberships.update(team=public_team)
    client.force_login(team_admin)
    token = api_tokens.create_token(user=team_admin, name="t", now=timezone.now())[1]
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    api = client.get(f"/api/jobs/{job.pk}", **bearer).json()
    with time_machine.travel(at(3600), tick=False):
        status = client.get("/status/back-lab.json").json()
        html = client.get("/status/back-lab/").content.decode()
        badge = client.get("/status/back-lab/badge.svg").content.decode()
        feed = client.get("/status/back-lab/feed.atom").content.decode()
    admin = client.get("/admin/jobs/interruption/").content.decode()
    note = messages.build(job.events.get(kind="running_again")).text

    (row,) = api["interruption_list"]
    assert (row["back_on_machine_s"], row["training_again_s"]) == (BACK_S, TRAINING_S)
    assert f"after {BACK} (" in page
    assert f"after {TRAINING} (" in page
    assert f"Where the {TRAINING} until training again went" in page
    assert status["back_on_machine_s"] == {"count": 1, "median": BACK_S, "p90": BACK_S}
    assert status["training_again_s"] == {"count": 1, "median": TRAINING_S, "p90": TRAINING_S}
    incident = status["incidents"][0]
    assert (incident["back_on_machine_s"], incident["training_again_s"]) == (BACK_S, TRAINING_S)
    assert f'id="n-back-median">{BACK}<' in html
    assert f'id="n-training-median">{TRAINING}<' in html
    assert f"training again p90: {TRAINING}" in badge
    assert f"Back on a machine after {BACK}. Training again after {TRAINING}" in feed
    assert f'field-back_on_machine_s">{BACK}<' in admin
    assert f'field-training_again_s">{TRAINING}<' in admin
    assert f"Training again after {TRAINING} (back on a machine after {BACK})" in note
    assert f"back on a machine after {BACK}, training again after {TRAINING}" in drill_summary(
        api, {"attempt": 1}
    )


@pytest.mark.django_db(transaction=True)
def test_the_cli_status_shows_the_same_two_figures(client, cast, live_server, capsys):
    job = recover(client, cast.team_a)
    token = api_tokens.create_token(user=cast.member, name="cli", now=timezone.now())[1]

    code = cli.main(["--url", live_server.url, "--token", token, "status", str(job.pk)])

    out = capsys.readouterr().out
    assert code == 0
    assert f"back on a machine after {BACK}, training again after {TRAINING}" in out
    assert "resumed from step 40" in out


# --- The timeline's words -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_host_lost_after_the_command_started_but_before_a_step_says_so(client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.STARTING)
    attempt, token = make_attempt(job, instance_id=901)
    heartbeat(client, token, 1, step=None)  # the command started, no step yet

    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "heartbeat_timeout"), now=timezone.now())

    client.force_login(cast.member)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    words = list(job.events.order_by("pk").values_list("kind", "message"))
    assert ("running", "the training command started") in words
    assert (
        "host_lost",
        "host lost (heartbeat_timeout) before the first training step; no checkpoint yet",
    ) in words
    assert "before training began" not in page
    assert "training started" not in page.replace("training command started", "")


@pytest.mark.django_db
def test_a_host_lost_while_starting_says_before_training_started(cast):
    job = JobFactory(team=cast.team_a, state=JobState.STARTING)
    attempt, _ = make_attempt(job, instance_id=902)

    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "never_registered"), now=timezone.now())

    assert job.events.get(kind="host_lost").message == (
        "host lost (never_registered) before training started; no checkpoint yet"
    )
    assert not Attempt.objects.get(pk=attempt.pk).running_at
