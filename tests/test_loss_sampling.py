"""Loss for the job page's chart is sampled on step buckets, not written on every heartbeat."""

from __future__ import annotations

import itertools

import pytest
from django.utils import timezone

from jobs.agent_api.heartbeat import record_heartbeat
from jobs.agent_api.heartbeat_store import Heartbeat
from jobs.models import Attempt, LossPoint, loss_sample_every
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db


def beat(seq: int, step: int, loss: float, total: int = 1000) -> Heartbeat:
    return Heartbeat(seq, "running", step, total, loss, 0.1, True, "", 0, 0, "")


def test_a_job_gets_about_a_hundred_loss_points_however_often_it_beats():
    job = JobFactory(total_steps=1000)
    attempt, _ = make_attempt(job, state="running")

    for seq, step in enumerate(range(0, 1000, 3)):  # a beat every 3 steps: 334 beats
        record_heartbeat(
            Attempt.objects.get(pk=attempt.pk), beat(seq, step, 1.0), now=timezone.now()
        )

    steps = list(LossPoint.objects.filter(job=job).values_list("step", flat=True))
    assert loss_sample_every(1000) == 10
    assert 95 <= len(steps) <= 101
    assert steps[0] == 0
    assert all(b // 10 > a // 10 for a, b in itertools.pairwise(steps))


def test_beats_without_loss_write_nothing():
    job = JobFactory(total_steps=100)
    attempt, _ = make_attempt(job, state="running")

    record_heartbeat(attempt, beat(1, 5, None, 100), now=timezone.now())  # type: ignore[arg-type]

    assert not LossPoint.objects.exists()
