"""One poisoned attempt, one poisoned job and one team whose Vast key cannot be read, beside a
healthy job: the healthy job's host loss is detected, re-rented and it finishes; each bad row
is written once where a person sees it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Interruption, JobEvent, JobState
from nomadgpu.models import ServiceHeartbeat
from tests.support.bad_rows import poison_vast_key
from tests.support.factories import JobFactory, TeamFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ENV = toy_env(steps=300, every=50, step_seconds=0.05)


def test_bad_rows_beside_a_healthy_job_never_stop_its_recovery(supervisor, client):
    now = timezone.now()
    team = supervisor.team
    team.public_status_page = True
    team.save()
    # A job whose silent attempt trips the loss handling (its avoid list is not a list).
    poisoned_attempt_job = JobFactory(team=team, state="running", avoid_machine_ids=7)
    make_attempt(
        poisoned_attempt_job,
        state="running",
        machine_id=4242,
        registered_at=now - timedelta(minutes=5),
        last_heartbeat_at=now - timedelta(minutes=1),
        heartbeat_deadline=now - timedelta(seconds=30),
        gpu_ok=True,
    )
    # A job whose requirements were hand-edited with a typo'd key.
    poisoned_job = JobFactory(team=team, state="queued", requirements={"gpu_name": "RTX 4090"})
    # A team whose Vast key no longer opens, with a live rental to poll.
    rotated = TeamFactory(slug="rotated")
    make_attempt(
        JobFactory(team=rotated, state="running"),
        state="running",
        instance_id=31337,
        registered_at=now,
        last_heartbeat_at=now,
        heartbeat_deadline=now + timedelta(hours=1),
        gpu_ok=True,
    )
    poison_vast_key(rotated)

    healthy = supervisor.submit_toy(env=ENV, total_steps=300)
    first = wait_running(healthy, 1)
    supervisor.sandbox.inject(first.instance_id, "destroy")
    wait_running(healthy, 2, timeout=90)
    wait_state(healthy, JobState.SUCCEEDED, timeout=90)

    assert Interruption.objects.get(attempt=first).cause.startswith("provider_")
    last = healthy.attempts.get(number=2)
    assert f"final-digest: {toy_digest(ENV)}" in last.log_tail

    poisoned_job.refresh_from_db()
    assert poisoned_job.state == JobState.NEEDS_ATTENTION
    held = JobEvent.objects.get(job=poisoned_job, kind="needs_attention")
    assert "requirements: unknown key 'gpu_name'" in held.message
    errors = JobEvent.objects.filter(job=poisoned_attempt_job, kind="supervisor_error")
    assert errors.count() == 1  # many ticks, one event
    assert "could not handle its host's loss: TypeError" in errors.get().message

    provider = ServiceHeartbeat.objects.get(name="provider")
    assert "team rotated: its Vast account cannot be used" in provider.detail["error"]
    page = wait_until(
        lambda: (
            (body := client.get(f"/status/{team.slug}/").content.decode())
            and "2 jobs need attention" in body
            and body
        ),
        timeout=10,
        what="the status page to count the two jobs needing attention",
    )
    assert poisoned_job.name not in page  # counted, never named
    assert poisoned_attempt_job.name not in page
