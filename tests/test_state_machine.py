"""Job transitions: guarded, recorded, side effects only after commit, illegal ones refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs import lifecycle
from jobs.lifecycle import Loss
from jobs.models import Attempt, Interruption, JobEvent, JobState
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_transition_moves_the_state_and_writes_an_event():
    job = JobFactory(state=JobState.QUEUED)

    event = lifecycle.transition(job.pk, JobState.RENTING, now=NOW, kind="renting")

    job.refresh_from_db()
    assert job.state == JobState.RENTING
    assert event.kind == "renting"


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (JobState.SUCCEEDED, JobState.RENTING),
        (JobState.CANCELLED, JobState.RUNNING),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.FAILED, JobState.RECOVERING),
        (JobState.RUNNING, JobState.STARTING),
    ],
)
def test_an_illegal_transition_is_refused(start, to):
    job = JobFactory(state=start)

    with pytest.raises(lifecycle.IllegalTransition) as refused:
        lifecycle.transition(job.pk, to, now=NOW, kind="x")

    job.refresh_from_db()
    assert job.state == start
    assert refused.value.current == start
    assert not JobEvent.objects.filter(job=job, kind="x").exists()


def test_a_loss_closes_the_attempt_records_an_interruption_and_destroys_after_commit(
    django_capture_on_commit_callbacks, monkeypatch
):
    destroyed = []
    monkeypatch.setattr(
        "jobs.lifecycle.send_task", lambda task, team, instance: destroyed.append((task, instance))
    )
    attempt, _ = make_attempt(state="running", instance_id=4242, machine_id=77, step=150)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert lifecycle.handle_loss(Loss(attempt.pk, "provider_gone"), now=NOW)
        assert destroyed == []  # not before commit
    for callback in callbacks:
        callback()

    attempt.refresh_from_db()
    job = attempt.job
    job.refresh_from_db()
    assert attempt.state == "ended"
    assert job.state == JobState.RECOVERING
    assert job.avoid_machine_ids == [77]
    assert Interruption.objects.get(attempt=attempt).step_reached == 150
    assert destroyed == [("jobs.tasks.destroy_instance", 4242)]


def test_a_second_loss_report_for_the_same_attempt_does_nothing(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    attempt, _ = make_attempt(state="running", instance_id=1)

    first = lifecycle.handle_loss(Loss(attempt.pk, "heartbeat_timeout"), now=NOW)
    second = lifecycle.handle_loss(Loss(attempt.pk, "provider_gone"), now=NOW)

    assert (first, second) == (True, False)
    assert Interruption.objects.filter(attempt=attempt).count() == 1


def test_running_again_closes_the_interruption_with_the_resumed_step(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    lost, _ = make_attempt(state="running", instance_id=1)
    lifecycle.handle_loss(Loss(lost.pk, "provider_gone"), now=NOW)
    job = lost.job
    lifecycle.transition(job.pk, JobState.RENTING, now=NOW, kind="renting")
    lifecycle.transition(job.pk, JobState.STARTING, now=NOW, kind="rented")
    new, _ = make_attempt(job, number=2, state="starting", resumed_from_step=100)

    lifecycle.mark_running(new, now=NOW + timedelta(minutes=5))

    interruption = Interruption.objects.get(attempt=lost)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert interruption.resumed_step == 100
    assert interruption.running_again_at == NOW + timedelta(minutes=5)
    assert job.events.filter(kind="back_on_machine").exists()
    assert interruption.training_again_at is None  # until its first step
    assert not job.events.filter(kind="running_again").exists()


def test_a_nonzero_exit_fails_the_job_and_rents_nothing(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    attempt, _ = make_attempt(state="running", instance_id=1, log_tail="ValueError: boom")

    lifecycle.handle_exit(attempt, exit_code=3, reason="failed", now=NOW)

    job = attempt.job
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "exit code 3"
    assert not Attempt.objects.filter(job=job, state__in=["planned", "requested"]).exists()


def test_exit_zero_finishes_the_job(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    attempt, _ = make_attempt(state="running", instance_id=1, step=300)

    lifecycle.handle_exit(attempt, exit_code=0, reason="finished", now=NOW)

    attempt.job.refresh_from_db()
    assert attempt.job.state == JobState.SUCCEEDED
    assert attempt.job.final_step == 300


def test_cancel_during_recovery_marks_the_interruption(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    attempt, _ = make_attempt(state="running", instance_id=1)
    lifecycle.handle_loss(Loss(attempt.pk, "provider_gone"), now=NOW)

    lifecycle.cancel_job(attempt.job_id, now=NOW)

    assert Interruption.objects.get(attempt=attempt).cancelled_before_recovery


def test_a_job_with_script_retries_runs_a_failing_command_again_then_fails(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    job = JobFactory(max_script_retries=1)
    first, _ = make_attempt(job, state="running", instance_id=1)

    lifecycle.handle_exit(first, exit_code=2, reason="failed", now=NOW)
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    assert job.events.filter(kind="script_retry").count() == 1
    assert job.avoid_machine_ids == []  # not the host's fault

    lifecycle.transition(job.pk, JobState.RENTING, now=NOW, kind="renting")
    lifecycle.transition(job.pk, JobState.STARTING, now=NOW, kind="rented")
    second, _ = make_attempt(job, number=2, state="running", instance_id=2)
    lifecycle.handle_exit(second, exit_code=2, reason="failed", now=NOW)

    job.refresh_from_db()
    assert job.state == JobState.FAILED
