"""A host whose image pull hangs, through the whole supervisor on the sandbox: Vast shows it
``loading`` for good (the sandbox's ``stuck-loading``), its start deadline from the image's
bytes and the offer's link passes, and the job moves to another host and finishes with the
uninterrupted run's weights, long before the 1200 s start timeout would have noticed.

The sandbox compresses Vast's minutes a hundredfold, so the supervisor's allowances for Vast's
own start and the agent's (``START_PROVISION_S``, ``START_BOOTSTRAP_S``) are shortened alike;
the image is the profile's, at the offer's advertised link."""

from __future__ import annotations

import pytest

from hosts.vast import VastClient
from jobs.models import Interruption, JobState
from tests.support.instances import live_instances
from tests.support.processes import wait_until
from tests.support.toy import final_digest_of, submit, toy_digest, toy_env
from tests.support.waiting import wait_interruption, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def first_pull_hangs(supervisor, monkeypatch):
    """The first attempt's instance is stuck in ``loading`` from its create on (the injection
    follows the create in the renting worker itself, so it lands before any agent could)."""
    create = VastClient.create_instance
    stuck: list[int] = []

    def create_then_hang(self, offer_id, **body):
        created = create(self, offer_id, **body)
        if body["label"].endswith(":1"):
            supervisor.sandbox.inject(created.id, "stuck-loading")
            stuck.append(created.id)
        return created

    monkeypatch.setattr(VastClient, "create_instance", create_then_hang)
    return stuck


def test_a_host_whose_pull_hangs_is_left_for_another_long_before_the_start_timeout(
    supervisor, settings, first_pull_hangs
):
    settings.START_PROVISION_S = 8
    settings.START_BOOTSTRAP_S = 8
    env = toy_env(steps=40, every=10, step_seconds=0.05)
    job = submit(supervisor, env, profile={"image_gb": 0.1, "model_gb": 0.0, "upload_gb": 0.01})

    first = wait_until(
        lambda: job.attempts.filter(number=1).exclude(instance_id=None).first(),
        timeout=60,
        what="the first host to be rented",
    )
    lost = wait_interruption(first, timeout=90)

    first.refresh_from_db()
    assert first_pull_hangs == [first.instance_id]
    assert first.registered_at is None
    assert lost.cause == "start_overdue"
    assert lost.detail.startswith("not running ")
    assert "pull of 0.1 GB at" in lost.detail
    assert "Mbit/s advertised" in lost.detail
    waited = (lost.detected_at - first.rented_at).total_seconds()
    assert waited < job.start_timeout_s == 1200
    assert first.provider_status == "loading"

    wait_state(job, JobState.SUCCEEDED, timeout=120)
    second = job.attempts.get(number=2)
    assert second.machine_id != first.machine_id
    assert second.registered_at is not None
    assert [i.attempt_id for i in Interruption.objects.filter(job=job)] == [first.pk]
    assert final_digest_of(job) == toy_digest(env)
    wait_until(
        lambda: not live_instances(supervisor.sandbox, job),
        timeout=30,
        what="nothing of the job left billing",
    )
