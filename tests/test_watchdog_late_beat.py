"""A watchdog pass judges the rows it read; a heartbeat stored between that read and the close
voids the loss (``Loss.due_at``, ``lifecycle.close_attempt``'s guard), while a silence that
nothing interrupted is still closed. Each step is driven here in order, with its own moment."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Attempt, Interruption, Job
from jobs.watchdog import deadlines, silence
from tests.support.agent_api import call
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db


def silent_attempt() -> tuple[Attempt, str]:
    """A running attempt whose last beat (seq 1, step 10) is an hour old: due, and silent."""
    long_ago = timezone.now() - timedelta(hours=1)
    job = JobFactory(heartbeat_interval_s=1)
    return make_attempt(
        job,
        state="running",
        step=10,
        last_seq=1,
        registered_at=long_ago,
        running_at=long_ago,
        last_progress_at=long_ago,
        last_heartbeat_at=long_ago,
        heartbeat_deadline=long_ago + job.heartbeat_timeout,
    )


def judged_now() -> list[lifecycle.Loss]:
    """The pass's read: the due attempts judged at its moment."""
    now = timezone.now()
    losses = deadlines.find_due_losses(now, silence.NO_EVIDENCE)
    assert {loss.due_at for loss in losses} <= {now}
    return losses


def test_a_beat_stored_after_the_pass_read_the_row_voids_the_silence_loss(client):
    attempt, token = silent_attempt()
    [loss] = judged_now()
    assert (loss.attempt_id, loss.cause) == (attempt.pk, "heartbeat_timeout")

    beat = {"seq": 2, "phase": "running", "step": 11, "gpu": {"ok": True}}
    assert call(client, token, "heartbeat", beat).status_code == 200
    closed = lifecycle.handle_loss(loss, now=loss.due_at)

    attempt.refresh_from_db()
    assert closed is False
    assert (attempt.state, attempt.end_reason, attempt.step) == ("running", "", 11)
    assert attempt.heartbeat_deadline > loss.due_at
    assert not Interruption.objects.filter(attempt=attempt).exists()
    assert Job.objects.get(pk=attempt.job_id).state == "running"
    assert judged_now() == []  # the next pass finds nothing due


def test_a_silence_no_beat_interrupted_is_still_closed():
    attempt, _ = silent_attempt()
    [loss] = judged_now()

    closed = lifecycle.handle_loss(loss, now=loss.due_at)

    attempt.refresh_from_db()
    assert closed is True
    assert (attempt.state, attempt.end_reason) == ("ended", "heartbeat_timeout")
    assert Interruption.objects.get(attempt=attempt).cause == "heartbeat_timeout"
    assert Job.objects.get(pk=attempt.job_id).state == "recovering"


def test_an_agent_registering_after_the_read_voids_its_start_loss(client):
    rented = timezone.now() - timedelta(hours=1)
    job = JobFactory(start_timeout_s=60)
    attempt, token = make_attempt(
        job, state="starting", rented_at=rented, heartbeat_deadline=rented
    )
    [loss] = judged_now()
    assert loss.attempt_id == attempt.pk

    assert call(client, token, "register", {"agent_version": "0.1"}).status_code == 200
    closed = lifecycle.handle_loss(loss, now=loss.due_at)

    attempt.refresh_from_db()
    assert closed is False
    assert attempt.state == "starting"
    assert attempt.registered_at is not None
    assert not Interruption.objects.filter(attempt=attempt).exists()
