"""A job's setup that fails is the job's own error, reported through the agent API's exit as
``setup_failed``: the job fails (or runs again under ``max_script_retries``), the page, the
member API and the event say "setup failed (exit N)" with the log tail, and no host is
blamed: no interruption, no avoided machine."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from jobs import lifecycle
from jobs.models import Attempt, Interruption, JobEvent, JobState
from notify import messages
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db

PIP_FAILURE = "Collecting flash-attn==9.9\nERROR: No matching distribution found for flash-attn"


@pytest.fixture(autouse=True)
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


def report_exit(client, token: str, **body):
    return client.post(
        "/api/agent/exit",
        data=json.dumps({"reason": "setup_failed", **body}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def on_host(job, number: int = 1):
    return make_attempt(job, number=number, state="starting", instance_id=100 + number)


def test_a_failed_setup_fails_the_job_with_its_exit_code_and_log_tail(client, cast):
    job = JobFactory(team=cast.team_a, setup="pip install flash-attn==9.9")
    attempt, token = on_host(job)

    response = report_exit(client, token, exit_code=2, log_tail=PIP_FAILURE)

    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "setup failed (exit 2)"
    failed = JobEvent.objects.get(job=job, kind="failed")
    assert failed.message == "setup failed (exit 2)"
    assert failed.data == {"exit_code": 2, "log_tail": PIP_FAILURE, "failed_in": "setup"}
    attempt.refresh_from_db()
    assert attempt.end_reason == "setup failed (exit 2)"
    assert not Interruption.objects.filter(job=job).exists()  # not a host loss
    assert job.avoid_machine_ids == []
    assert not Attempt.objects.filter(job=job).live().exists()  # nothing re-rented


def test_the_job_page_and_the_member_api_say_setup_failed_with_the_log_tail(client, cast):
    job = JobFactory(team=cast.team_a, setup="pip install flash-attn==9.9")
    _, token = on_host(job)
    report_exit(client, token, exit_code=2, log_tail=PIP_FAILURE)
    client.force_login(cast.member)

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    shown = client.get(f"/api/jobs/{job.pk}").json()
    logs = client.get(f"/api/jobs/{job.pk}/logs").json()
    events = client.get(f"/api/jobs/{job.pk}/events").json()["events"]

    assert "setup failed (exit 2)" in page
    assert "No matching distribution found for flash-attn" in page
    assert shown["failure_reason"] == "setup failed (exit 2)"
    assert [line["text"] for line in logs["lines"]] == PIP_FAILURE.split("\n")
    assert events[-1]["message"] == "setup failed (exit 2)"


def test_a_setup_failure_without_an_exit_code_is_exit_1_and_says_the_agents_sentence(client, cast):
    job = JobFactory(team=cast.team_a)
    _, token = on_host(job)

    report_exit(client, token, error="git is not installed in the image", log_tail="")

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "setup failed (exit 1)"
    failed = JobEvent.objects.get(job=job, kind="failed")
    assert failed.message == "setup failed (exit 1): git is not installed in the image"


def test_a_setup_failure_never_finishes_the_job_even_when_it_says_exit_0(client, cast):
    job = JobFactory(team=cast.team_a)
    _, token = on_host(job)

    report_exit(client, token, exit_code=0, log_tail="")

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "setup failed (exit 1)"


def test_max_script_retries_runs_a_failing_setup_again_then_fails_the_job(client, cast):
    job = JobFactory(team=cast.team_a, max_script_retries=1)
    _, token = on_host(job)

    report_exit(client, token, exit_code=2, log_tail=PIP_FAILURE)

    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    retry = JobEvent.objects.get(job=job, kind="script_retry")
    assert retry.message == "setup failed (exit 2); running it again"
    lifecycle.transition(job.pk, JobState.RENTING, now=retry.created_at, kind="renting")
    lifecycle.transition(job.pk, JobState.STARTING, now=retry.created_at, kind="rented")
    _, second = on_host(job, number=2)

    report_exit(client, second, exit_code=2, log_tail=PIP_FAILURE)

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "setup failed (exit 2)"
    assert not Interruption.objects.filter(job=job).exists()


def test_a_failed_setup_and_a_failed_command_share_the_retries(client, cast):
    job = JobFactory(team=cast.team_a, max_script_retries=1)
    first, token = on_host(job)
    report_exit(client, token, exit_code=2, log_tail="")
    lifecycle.transition(job.pk, JobState.RENTING, now=first.created_at, kind="renting")
    lifecycle.transition(job.pk, JobState.STARTING, now=first.created_at, kind="rented")
    _, second = on_host(job, number=2)

    client.post(
        "/api/agent/exit",
        data=json.dumps({"reason": "failed", "exit_code": 3, "log_tail": ""}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {second}"},
    )

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure_reason == "exit code 3"


def test_the_failed_notification_says_the_setup_failed_not_the_command(client, cast):
    job = JobFactory(team=cast.team_a)
    _, token = on_host(job)
    report_exit(client, token, exit_code=2, log_tail=PIP_FAILURE)

    message = messages.build(JobEvent.objects.get(job=job, kind="failed"))

    assert "Setup failed (exit 2); the command never started." in message.text
    assert "No matching distribution found for flash-attn" in message.text
    assert "training command exited" not in message.text
