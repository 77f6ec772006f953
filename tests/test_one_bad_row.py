"""One bad row never stops the watchdog's pass (``jobs.attention``): its error is written once
on its job, a job whose stored spec no longer validates waits for a person, and a team whose
Vast key cannot be read is a supervisor-health line. The whole stack beside a healthy job is
``tests/e2e/test_one_bad_row.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs import attention
from jobs.models import Attempt, Interruption, Job, JobEvent, JobState
from jobs.watchdog import passes, poll
from tests.support.bad_rows import poison_vast_key
from tests.support.factories import JobFactory, TeamFactory, make_attempt

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def tick(at: datetime = NOW) -> dict:
    return passes.tick(now=at, poll_provider=False)


def silent_attempt(job: Job) -> Attempt:
    attempt, _ = make_attempt(
        job,
        state="running",
        machine_id=4242,
        registered_at=NOW - timedelta(minutes=10),
        last_heartbeat_at=NOW - timedelta(seconds=60),
        heartbeat_deadline=NOW - timedelta(seconds=30),
        gpu_ok=True,
    )
    return attempt


@pytest.mark.django_db
def test_a_job_whose_stored_requirements_no_longer_validate_waits_for_a_person():
    job = JobFactory(state="queued", requirements={"gpu_name": "RTX 4090"})

    tick()
    tick(NOW + timedelta(seconds=5))

    job.refresh_from_db()
    assert job.state == JobState.NEEDS_ATTENTION
    assert not job.attempts.exists()
    [held] = JobEvent.objects.filter(job=job, kind="needs_attention")
    assert "requirements: unknown key 'gpu_name'" in held.message
    assert "Fix the job in the admin" in held.message
    assert held.data["fields"] == ["requirements.gpu_name"]
    assert job.failure_reason == held.message  # what the job page, the API and the CLI show


@pytest.mark.django_db
def test_a_fixed_job_is_queued_again_and_planned(django_capture_on_commit_callbacks):
    job = JobFactory(state="queued", requirements={"gpu_name": "RTX 4090"})
    tick()
    job.refresh_from_db()
    assert not attention.requeue_if_fixed(job, by="alice", now=NOW)  # still broken

    Job.objects.filter(pk=job.pk).update(requirements={"gpu_names": ["RTX 4090"]})
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        assert attention.requeue_if_fixed(job, by="alice", now=NOW)

    job.refresh_from_db()
    assert job.state == JobState.RENTING
    assert job.attempts.count() == 1
    assert job.events.filter(kind="fixed").get().message == "fixed by alice; renting again"
    assert job.failure_reason == ""


@pytest.mark.django_db
def test_a_poisoned_attempt_is_written_once_and_the_others_are_still_handled():
    # Hand-edited JSON that the loss handling trips on (an avoid list that is not a list).
    poisoned = JobFactory(state="running", avoid_machine_ids=7)
    healthy = JobFactory(state="running")
    silent_attempt(poisoned)
    lost = silent_attempt(healthy)
    beating = silent_attempt(JobFactory(state="running"))  # ingest works: not all are silent
    Attempt.objects.filter(pk=beating.pk).update(
        last_heartbeat_at=NOW, heartbeat_deadline=NOW + timedelta(seconds=26)
    )

    first = tick()
    tick(NOW + timedelta(seconds=5))

    assert first["lost"] == 1
    assert Interruption.objects.get().attempt_id == lost.pk
    [error] = JobEvent.objects.filter(job=poisoned, kind="supervisor_error")
    assert error.message.startswith("the supervisor could not handle its host's loss: TypeError")
    assert attention.failed_in_last_pass()["jobs"] == [poisoned.pk]


@pytest.mark.django_db
def test_a_team_whose_vast_key_cannot_be_read_is_left_out_of_the_poll_and_said_so():
    broken, fine = TeamFactory(slug="rotated"), TeamFactory(slug="fine")
    make_attempt(JobFactory(team=broken, state="running"), state="running", instance_id=1)
    kept, _ = make_attempt(JobFactory(team=fine, state="running"), state="running", instance_id=2)
    poison_vast_key(broken)
    errors: list[str] = []

    grouped = poll.attempts_by_account(errors)

    assert [a.pk for attempts in grouped.values() for a in attempts] == [kept.pk]
    assert len(errors) == 1
    assert errors[0].startswith("team rotated: its Vast account cannot be used (SecretUnreadable")


@pytest.mark.django_db
def test_the_job_page_and_the_api_say_why_a_held_job_stopped(client, cast):
    from django.urls import reverse

    job = JobFactory(team=cast.team_a, state="queued", requirements={"gpu_name": "RTX 4090"})
    assert attention.hold_if_spec_invalid(job, now=NOW)
    client.force_login(cast.member)

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    api = client.get(f"/api/jobs/{job.pk}").json()

    assert "Needs attention" in page
    assert "requirements: unknown key &#x27;gpu_name&#x27;" in page
    assert api["state"] == "needs_attention"
    assert "requirements: unknown key 'gpu_name'" in api["failure_reason"]
