"""Drills are not interruptions: a host destroyed on purpose (``jobs.drill``) is marked before
the destroy, recorded as a drill when its loss is found, kept on the job's timeline as one, and
never moves the status page (page, JSON, badge), the interruption rates that price rentals and
the checkpoint interval, or the machine's record. Only the provider's HTTP edge is faked."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.apps import apps
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from hosts.models import Machine
from hosts.vast import VastClient
from hosts.vast.errors import ProviderError
from jobs import lifecycle
from jobs.checkpoints.requests import machine_record
from jobs.models import Attempt, Interruption, Job, JobState
from jobs.renting.interruption_rates import preemption_rates
from nomadgpu import api_tokens
from nomadgpu.models import Role
from tests.support.factories import (
    InterruptionFactory,
    JobEventFactory,
    JobFactory,
    MembershipFactory,
    TeamFactory,
    make_attempt,
)

pytestmark = pytest.mark.django_db

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MACHINE = 4711


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


@pytest.fixture
def team():
    cache.clear()
    yield TeamFactory(name="Drill Lab", slug="drill-lab", time_zone="UTC", public_status_page=True)
    cache.clear()


@pytest.fixture
def admin_bearer(team) -> dict:
    admin = MembershipFactory(team=team, role=Role.ADMIN).user
    token = api_tokens.create_token(user=admin, name="t", now=timezone.now())[1]
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def provider(monkeypatch):
    """Vast's destroy, faked at the client: records what the attempt looked like when it was
    called, and answers as told (True: destroyed; False: already gone; an exception)."""

    class Provider:
        def __init__(self) -> None:
            self.answer: object = True
            self.marked_at_destroy: list[bool] = []

        def destroy(self, instance_id: int) -> bool:
            attempt = Attempt.objects.get(instance_id=instance_id)
            self.marked_at_destroy.append(attempt.drilled_at is not None)
            if isinstance(self.answer, Exception):
                raise self.answer
            return bool(self.answer)

    fake = Provider()
    monkeypatch.setattr(VastClient, "destroy_instance", fake.destroy)
    return fake


def heartbeat(client, token: str, seq: int, *, step: int | None) -> None:
    body = {"seq": seq, "phase": "running", "step": step, "total_steps": 300, "gpu": {"ok": True}}
    response = client.post(
        "/api/agent/heartbeat",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200


def running_job(team, *, number: int = 1, job=None) -> tuple[Job, Attempt, str]:
    job = job or JobFactory(team=team, state=JobState.RUNNING, total_steps=300)
    Machine.objects.get_or_create(machine_id=MACHINE, defaults={"gpu_name": "RTX 4090"})
    attempt, token = make_attempt(
        job, number=number, state="running", instance_id=5000 + number + 10 * job.pk,
        machine_id=MACHINE, gpu_name="RTX 4090", rented_at=T - timedelta(hours=2), step=91,
        last_heartbeat_at=T,
    )  # fmt: skip
    return job, attempt, token


def drill(client, job, bearer):
    return client.post(f"/api/jobs/{job.pk}/drill", content_type="application/json", **bearer)


def lose_and_recover(client, job: Job, attempt: Attempt, *, number: int) -> None:
    """The watchdog finds the host gone 20 s after its last heartbeat; a replacement runs at
    +40 s and steps at +60 s, through the agent API."""
    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "provider_gone"), now=at(20))
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)
    _, token = make_attempt(
        job, number=number, instance_id=6000 + number + 10 * job.pk, resumed_from_step=90,
        rented_at=at(30),
    )  # fmt: skip
    with time_machine.travel(at(40), tick=False):
        heartbeat(client, token, 1, step=None)
    with time_machine.travel(at(60), tick=False):
        heartbeat(client, token, 2, step=91)


# --- The mark and the record ------------------------------------------------------------------


def test_the_drill_marks_its_attempt_before_the_host_is_destroyed(client, team, provider,
                                                                   admin_bearer):  # fmt: skip
    job, attempt, _ = running_job(team)

    response = drill(client, job, admin_bearer)

    assert response.status_code == 202
    assert provider.marked_at_destroy == [True]  # the watchdog can never see it unmarked
    assert Attempt.objects.get(pk=attempt.pk).drilled_at is not None


def test_a_drilled_hosts_loss_is_a_drill_on_the_timeline_and_not_the_machines_fault(
    client, team, provider, admin_bearer
):
    job, attempt, _ = running_job(team)
    drill(client, job, admin_bearer)

    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "provider_gone"), now=at(20))

    row = Interruption.objects.get(attempt=attempt)
    lost = job.events.get(kind="host_lost")
    assert row.drill
    assert lost.message.startswith("fire drill: host lost as planned (provider_gone) at step 91")
    assert lost.data["drill"] is True
    assert Machine.objects.filter(machine_id=MACHINE, interruptions__gt=0).count() == 0
    assert Job.objects.get(pk=job.pk).avoid_machine_ids == [MACHINE]  # moved off it all the same
    client.force_login(job.team.memberships.get(role=Role.ADMIN).user)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    api = client.get(f"/api/jobs/{job.pk}", **admin_bearer).json()
    assert "fire drill: host lost as planned" in page
    assert "(fire drill: not counted on the status page)" in page
    assert api["interruption_list"][0]["drill"] is True


def test_a_destroy_the_provider_refused_takes_the_mark_back(client, team, provider, admin_bearer):
    job, attempt, _ = running_job(team)
    provider.answer = ProviderError("boom", status=500)

    response = drill(client, job, admin_bearer)
    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "heartbeat_timeout"), now=at(90))

    assert response.status_code == 502
    assert not Interruption.objects.get(attempt=attempt).drill  # a later loss is a real one
    assert Machine.objects.get(machine_id=MACHINE).interruptions == 1


def test_an_instance_already_gone_is_a_real_loss_not_a_drill(client, team, provider, admin_bearer):
    job, attempt, _ = running_job(team)
    provider.answer = False

    response = drill(client, job, admin_bearer)

    assert response.status_code == 409
    assert "already gone at the provider: a real loss, not a drill" in response.json()["detail"]
    assert Attempt.objects.get(pk=attempt.pk).drilled_at is None
    assert not job.events.filter(kind="drill").exists()


# --- Nothing public and no rate moves ---------------------------------------------------------


def public_numbers(client) -> tuple:
    cache.clear()
    with time_machine.travel(at(3600), tick=False):
        body = client.get("/status/drill-lab.json").json()
        page = client.get("/status/drill-lab/").content.decode()
        badge = client.get("/status/drill-lab/badge.svg").content
        feed = client.get("/status/drill-lab/feed.atom").content.decode()
    tiles = page[page.index('<dl class="tiles">') : page.index("</dl>")]
    # What the jobs cost against the reference is money really paid, drill or not: the savings
    # move with the hours rented; every interruption figure must not.
    body.pop("savings")
    return body, tiles, badge, feed.count("<entry>")


def test_a_drill_never_moves_the_status_page_its_json_the_feed_or_the_badge(
    client, team, provider, admin_bearer
):
    # One real recovery on another job: the numbers a drill must leave as they are.
    real_job, real, _ = running_job(team)
    lose_and_recover(client, real_job, real, number=2)
    job, attempt, _ = running_job(team, job=JobFactory(team=team, state=JobState.RUNNING))
    before = public_numbers(client)

    drill(client, job, admin_bearer)
    lose_and_recover(client, job, attempt, number=2)
    after = public_numbers(client)

    assert Interruption.objects.get(attempt=attempt).training_again_at is not None  # recovered
    assert before == after
    body = after[0]
    assert (body["interruptions"], body["resumed"]) == (1, 1)
    assert body["training_again_s"]["count"] == 1
    assert sum(day["interruptions"] for day in body["daily"]) == 1


def test_a_drill_never_raises_the_interruption_rates_or_the_machines_record(
    client, team, provider, admin_bearer
):
    job, attempt, _ = running_job(team)
    drill(client, job, admin_bearer)
    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "provider_gone"), now=at(20))
    drilled = preemption_rates(team.pk, now=at(60)).observed[("on-demand", "RTX 4090", 0.0)]
    drilled_machine = machine_record(MACHINE, now=at(60))

    _, real, _ = running_job(team, job=JobFactory(team=team, state=JobState.RUNNING))
    lifecycle.handle_loss(lifecycle.Loss(real.pk, "provider_gone"), now=at(20))
    with_real = preemption_rates(team.pk, now=at(60)).observed[("on-demand", "RTX 4090", 0.0)]

    assert drilled[0] == 0  # no interruption in the drilled attempt's rented hours
    assert drilled[1] > 0
    assert drilled_machine[0] == 0  # the checkpoint interval's MTBF reads this record
    assert with_real[0] == 1  # the same loss without the drill counts
    assert machine_record(MACHINE, now=at(60))[0] == 1


# --- Rows recorded before drills were marked --------------------------------------------------


def test_the_migration_marks_past_drills_and_dates_past_first_steps(team):
    job = JobFactory(team=team)
    drilled, _ = make_attempt(job, number=1, state="ended")
    replacement, _ = make_attempt(job, number=2, state="running", first_step_at=at(74))
    row = InterruptionFactory(attempt=drilled, detected_at=at(20), replacement=replacement,
                              running_again_at=at(46))  # fmt: skip
    JobEventFactory(job=job, kind="drill", data={"attempt": 1, "instance_id": 1})
    migration = importlib.import_module("jobs.migrations.0023_drills_and_training_again")

    migration.backfill(apps, None)

    row.refresh_from_db()
    assert row.drill
    assert row.training_again_at == at(74)
