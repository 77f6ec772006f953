"""A command that exits 0 before its last step: the job succeeds (scripts may stop early on
purpose), and the job page, the member API and the finished notification all say where it
ended, in the same words. Driven through the agent API's real URLs, as an agent would."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import CheckpointState, JobState
from nomadgpu import api_tokens
from nomadgpu.storage import object_store
from notify import outbox
from tests.support import telegram_fake
from tests.support.factories import ChannelFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db

EARLY = "ended at step 100 of 2,400"


@pytest.fixture
def telegram(settings):
    with telegram_fake.running() as fake:
        settings.TELEGRAM_API_URL = fake.url
        yield fake


@pytest.fixture
def local_storage(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url


@pytest.fixture
def job(cast, telegram, local_storage):
    """A team-A job of 2,400 steps keeping one checkpoint, its host running, a chat subscribed."""
    ChannelFactory(
        team=cast.team_a,
        kind="telegram",
        name="ops chat",
        chat_id="4242",
        telegram_bot_token="123456789:AAH-test-token-for-early-finish",
    )
    return JobFactory(team=cast.team_a, name="sft-7b", total_steps=2400, keep_last=1)


def agent_call(client, token: str, name: str, body: dict):
    response = client.post(
        f"/api/agent/{name}",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.content
    return response.json()


def upload_checkpoint(client, token: str, step: int, data: bytes) -> None:
    plan = agent_call(client, token, "checkpoints", {"step": step, "size": len(data)})
    assert httpx.put(plan["upload"]["url"], content=data).status_code == 200
    digest = hashlib.sha256(data).hexdigest()
    done = f"checkpoints/{plan['checkpoint_id']}/complete"
    agent_call(client, token, done, {"size": len(data), "sha256": digest})


def run_until_exit_0(client, job, *, last_step: int) -> None:
    """An agent's life: heartbeats up to LAST_STEP, a checkpoint at 50 and at LAST_STEP, exit 0."""
    _, token = make_attempt(job, state="running")
    for seq, step in enumerate((50, last_step), start=1):
        beat = {"seq": seq, "phase": "running", "step": step, "total_steps": 2400}
        agent_call(client, token, "heartbeat", {**beat, "gpu": {"ok": True}})
        upload_checkpoint(client, token, step, f"weights at {step}".encode())
    agent_call(client, token, "exit", {"exit_code": 0, "reason": "finished", "log_tail": "bye"})
    job.refresh_from_db()


def member_api_detail(client, cast, job) -> dict:
    _, secret = api_tokens.create_token(user=cast.member, name="cli", now=timezone.now())
    response = client.get(f"/api/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    return response.json()


def job_page(client, cast, job) -> str:
    client.force_login(cast.member)
    return client.get(reverse("job-detail", args=[job.pk])).content.decode()


def finished_notification(telegram) -> str:
    outbox.deliver_due(timezone.now())
    [text] = [t for t in telegram.texts() if "Job finished" in t]
    return text


def test_an_exit_0_at_step_100_of_2400_succeeds_and_every_view_says_it_ended_early(
    client, cast, job, telegram
):
    run_until_exit_0(client, job, last_step=100)

    assert (job.state, job.final_step) == (JobState.SUCCEEDED, 100)
    assert member_api_detail(client, cast, job)["early_finish"] == EARLY
    assert f"Succeeded, but {EARLY}: the command exited 0 before its last step" in job_page(
        client, cast, job
    )
    assert f"Succeeded, but {EARLY}: the command exited 0 before its last step" in (
        finished_notification(telegram)
    )


def test_the_checkpoint_at_the_early_end_is_kept(client, cast, job):
    run_until_exit_0(client, job, last_step=100)

    states = dict(job.checkpoints.values_list("step", "state"))
    assert states == {50: CheckpointState.PRUNED, 100: CheckpointState.READY}
    newest = job.checkpoints.get(step=100)
    with object_store(job.team).open_read(newest.key) as stored:
        assert stored.read() == b"weights at 100"


def test_a_job_that_reaches_its_last_step_says_nothing_about_ending_early(
    client, cast, job, telegram
):
    run_until_exit_0(client, job, last_step=2400)

    assert job.state == JobState.SUCCEEDED
    assert member_api_detail(client, cast, job)["early_finish"] == ""
    assert "ended at step" not in job_page(client, cast, job)
    notification = finished_notification(telegram)
    assert "final step 2400" in notification
    assert "ended at step" not in notification
