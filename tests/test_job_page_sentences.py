"""The job page's sentences agree with its numbers: a resume past the last heartbeat's step
says why no work was lost, the rent decision says where its interruption rate came from in
words, and a step that went back after a host loss says that work is being done again."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts.selection import ON_DEMAND, PreemptionRates
from jobs import anatomy, lifecycle
from jobs.models import Attempt, Checkpoint, Interruption, Job, JobState
from tests.support.factories import CheckpointFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


def page(client, job) -> str:
    return client.get(reverse("job-detail", args=[job.pk])).content.decode()


def ready_checkpoint(attempt, step: int) -> Checkpoint:
    return CheckpointFactory(attempt=attempt, step=step, state="ready", ready_at=timezone.now())


def lost_at(job, step: int, *, checkpoint: int | None) -> Attempt:
    """JOB's running host reached STEP (its last heartbeat), CHECKPOINT is ready; then the
    watchdog declares it lost, as ``handle_loss`` does."""
    attempt, _ = make_attempt(
        job, state="running", instance_id=31, step=step, total_steps=300,
        last_heartbeat_at=timezone.now(),
    )  # fmt: skip
    if checkpoint is not None:
        ready_checkpoint(attempt, checkpoint)
    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "heartbeat_timeout"), now=timezone.now())
    return attempt


def running_again(job, *, resumed: int, step: int) -> Attempt:
    """The replacement reports training from checkpoint RESUMED (``mark_running``), now at STEP."""
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)  # rented, as renting does
    replacement, _ = make_attempt(
        job, number=2, state="starting", instance_id=32, resumed_from_step=resumed,
        total_steps=300,
    )  # fmt: skip
    lifecycle.mark_running(replacement, now=timezone.now())
    Attempt.objects.filter(pk=replacement.pk).update(step=step)
    return replacement


# --- A resume past the step last reported ---------------------------------------------------


def test_a_checkpoint_written_after_the_last_heartbeat_is_no_lost_work_and_says_so(
    member_client, cast
):
    # The drill's case: destroyed with step 48 reported, checkpoint 50 already uploaded.
    job = JobFactory(team=cast.team_a, state=JobState.RUNNING, total_steps=300)
    lost_at(job, 48, checkpoint=50)
    running_again(job, resumed=50, step=55)

    html = page(member_client, job)

    assert "resumed from step 50" in html
    assert (
        "Work lost: none — checkpoint 50 was written after the last heartbeat, which reported "
        "step 48." in html
    )
    assert "0 steps redone" not in html


def test_the_member_api_compares_the_two_steps_in_words(client, cast):
    from nomadgpu import api_tokens

    job = JobFactory(team=cast.team_a, state=JobState.RUNNING, total_steps=300)
    lost_at(job, 48, checkpoint=50)
    running_again(job, resumed=50, step=55)
    token = api_tokens.create_token(user=cast.member, name="t", now=timezone.now())[1]

    body = client.get(f"/api/jobs/{job.pk}", headers={"Authorization": f"Bearer {token}"})

    [interruption] = body.json()["interruption_list"]
    assert interruption["resume_note"] == (
        "checkpoint 50 was written after the last heartbeat, which reported step 48: no work lost"
    )


def test_resume_notes_say_how_the_resumed_step_compares_with_the_one_reached():
    assert anatomy.resume_note(91, 57) == "34 steps done again: the host had reached step 91"
    assert anatomy.resume_note(58, 57) == "1 step done again: the host had reached step 58"
    assert anatomy.resume_note(50, 50) == "no work lost"
    assert anatomy.resume_note(None, 50) == ""


# --- The rent decision's rate ---------------------------------------------------------------


def test_the_rate_source_reads_in_minutes_under_an_hour_and_names_the_prior():
    def source(seen: int, hours: float) -> str:
        rates = PreemptionRates({(ON_DEMAND, "RTX 4090", 0.0): (seen, hours)})
        return rates.rate(ON_DEMAND, "RTX 4090")[1]

    assert source(1, 0.004) == (
        "the team's 1 interruption in under a minute rented, weighed with a 10 h prior"
    )
    assert source(1, 0.6) == "the team's 1 interruption in 36 min rented, weighed with a 10 h prior"
    assert source(3, 12.25) == (
        "the team's 3 interruptions in 12.2 h rented, weighed with a 10 h prior"
    )


def test_the_job_page_says_a_prior_rate_is_the_prior(member_client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.RUNNING)
    rental = {
        "rental": {"kind": ON_DEMAND, "bid_margin": 0.0, "label": "on demand"},
        "gpu_usd_per_hour": 0.3, "preemptions_per_h": 0.02, "rate_source": "prior",
        "expected_preemptions": 0.01, "rework_usd": 0.01, "rework_h": 0.1,
    }  # fmt: skip
    offer = {"id": 7, "machine_id": 70, "gpu_name": "RTX 4090", "num_gpus": 1}
    make_attempt(
        job, state="running", instance_id=33,
        decision={"chosen_offer_id": 7, "chosen": {"offer": offer}, "rental": rental},
    )  # fmt: skip

    html = page(member_client, job)

    assert "expected (the prior: no history of this rental yet)" in html


# --- A step that went back ------------------------------------------------------------------


def test_after_a_loss_the_page_says_which_steps_will_be_done_again(member_client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.RUNNING, total_steps=300)
    lost_at(job, 91, checkpoint=57)

    html = page(member_client, job)

    assert 'id="job-step">91<' in html  # still the lost host's step
    assert (
        "Host lost at step 91; training resumes from checkpoint 57, so steps 58 to 91 will be "
        "done again." in html
    )


def test_while_the_replacement_redoes_them_the_step_that_went_back_is_explained(
    member_client, cast
):
    job = JobFactory(team=cast.team_a, state=JobState.RUNNING, total_steps=300)
    lost_at(job, 91, checkpoint=57)
    replacement = running_again(job, resumed=57, step=60)

    redoing = page(member_client, job)
    Attempt.objects.filter(pk=replacement.pk).update(step=95)
    caught_up = page(member_client, job)

    assert 'id="job-step">60<' in redoing
    assert (
        "Host lost at step 91; training resumed from checkpoint 57, so steps 58 to 91 are being "
        "done again." in redoing
    )
    assert "job-rework" not in caught_up
    assert Interruption.objects.get(job=job).resumed_step == 57


def test_a_loss_before_any_checkpoint_says_training_starts_again_from_step_0(member_client, cast):
    job = JobFactory(team=cast.team_a, state=JobState.RUNNING, total_steps=300)
    lost_at(job, 12, checkpoint=None)

    assert (
        "Host lost at step 12; training starts again from step 0 (no checkpoint yet), so steps "
        "1 to 12 will be done again." in page(member_client, job)
    )
