"""The agent API through its real URLs: tokens, register, heartbeats, checkpoints, exit."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import httpx
import pytest

from jobs.models import HEARTBEAT_TIMEOUT_INTERVALS, Attempt, Checkpoint, CheckpointState
from tests.support.agent_api import call
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db


def beat(seq: int, step: int | None = None, **extra) -> dict:
    return {"seq": seq, "phase": "running", "step": step, "gpu": {"ok": True}, **extra}


@pytest.fixture
def local_storage(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url
    return settings.STORAGE_LOCAL_DIR


def test_an_unknown_token_gets_401_with_a_json_body(client):
    response = call(client, "ngat_not-a-real-token-at-all", "register", {"agent_version": "1"})

    assert response.status_code == 401
    assert "detail" in response.json()


def test_the_token_of_an_ended_attempt_gets_410_saying_stop(client):
    _, token = make_attempt(state="ended", end_reason="host lost")

    response = call(client, token, "heartbeat", beat(1, 5))

    assert response.status_code == 410
    assert "stop" in response.json()["detail"]
    assert "host lost" in response.json()["detail"]


def test_a_heartbeat_with_the_right_prefix_but_a_wrong_secret_gets_401_and_writes_nothing(client):
    attempt, token = make_attempt(state="running")
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")

    response = call(client, forged, "heartbeat", beat(7, 70, log_tail="forged"))
    attempt.refresh_from_db()

    assert response.status_code == 401
    assert attempt.last_seq == -1
    assert attempt.step is None
    assert attempt.log_tail == ""


def test_register_tells_the_agent_what_to_run(client):
    job = JobFactory(command="python train.py", env={"LR": "2e-4"}, heartbeat_interval_s=10)
    attempt, token = make_attempt(job)

    body = call(client, token, "register", {"agent_version": "0.1", "gpus": []}).json()

    assert body["command"] == "python train.py"
    assert body["env"] == {"LR": "2e-4"}
    assert body["heartbeat_interval_s"] == 10
    assert body["resume"] is None
    attempt.refresh_from_db()
    assert attempt.registered_at is not None
    assert attempt.heartbeat_deadline > attempt.registered_at


def test_an_agent_restarted_in_the_same_container_keeps_the_first_registration(client):
    # The recovery anatomy reads registered_at, and billing.spend starts the GPU there where
    # the poll never saw the instance running: a second register must not move it.
    attempt, token = make_attempt(state="running")
    call(client, token, "register", {"agent_version": "0.1"})
    attempt.refresh_from_db()
    first = attempt.registered_at
    Attempt.objects.filter(pk=attempt.pk).update(registered_at=first - timedelta(hours=2))

    assert call(client, token, "register", {"agent_version": "0.1"}).status_code == 200

    attempt.refresh_from_db()
    assert attempt.registered_at == first - timedelta(hours=2)
    assert attempt.last_heartbeat_at > attempt.registered_at  # the beat clock does restart


@pytest.mark.parametrize(
    ("profile", "mode"),
    [
        ({"checkpoint": "auto"}, "auto"),
        ({"checkpoint": "script"}, "script"),
        ({}, "script"),
        ({"checkpoint": "every 50 steps"}, "script"),
    ],
)
def test_register_says_whether_the_supervisor_chooses_when_to_checkpoint(client, profile, mode):
    job = JobFactory(profile=profile, keep_last=4)
    _, token = make_attempt(job)

    body = call(client, token, "register", {"agent_version": "0.1"}).json()

    assert body["checkpoint"]["mode"] == mode
    assert body["checkpoint"]["keep_last"] == 4


def test_a_fractional_heartbeat_interval_reaches_the_agent_and_sets_the_deadline(client):
    job = JobFactory(heartbeat_interval_s=0.5)
    attempt, token = make_attempt(job)

    registered = call(client, token, "register", {"agent_version": "0.1", "gpus": []}).json()
    beat_reply = call(client, token, "heartbeat", beat(1, 1)).json()
    attempt.refresh_from_db()

    assert registered["heartbeat_interval_s"] == 0.5
    assert beat_reply["heartbeat_interval_s"] == 0.5
    # The silence allowed is counted in intervals, not rounded to whole seconds.
    ahead = (attempt.heartbeat_deadline - attempt.last_heartbeat_at).total_seconds()
    assert ahead == pytest.approx(0.5 * HEARTBEAT_TIMEOUT_INTERVALS, abs=0.05)


def test_heartbeats_record_progress_and_move_the_deadline(client):
    attempt, token = make_attempt()

    first = call(client, token, "heartbeat", beat(1, 10, loss=1.5, bytes_down=100))
    attempt.refresh_from_db()
    deadline_1 = attempt.heartbeat_deadline
    call(client, token, "heartbeat", beat(2, 12, loss=1.2))
    attempt.refresh_from_db()

    assert first.json() == {"command": "continue", "heartbeat_interval_s": 15}
    assert attempt.step == 12
    assert attempt.loss == 1.2
    assert attempt.heartbeat_deadline >= deadline_1
    assert attempt.last_seq == 2


def test_heartbeats_record_the_containers_traffic_and_an_older_agents_keep_it(client):
    attempt, token = make_attempt()
    traffic = {"net_rx_bytes": 3 * 1024**3 + 17, "net_tx_bytes": 4_000_000}

    call(client, token, "heartbeat", beat(1, 10, bytes_down=100, **traffic))
    call(client, token, "heartbeat", beat(2, 11, bytes_down=100))  # an agent without counters
    attempt.refresh_from_db()

    assert (attempt.net_rx_bytes, attempt.net_tx_bytes) == (3 * 1024**3 + 17, 4_000_000)
    assert attempt.bytes_down == 100
    assert call(client, token, "heartbeat", beat(3, net_rx_bytes=-1)).status_code == 422


def test_a_repeated_or_out_of_order_heartbeat_is_harmless(client):
    attempt, token = make_attempt()
    call(client, token, "heartbeat", beat(5, 40))

    replay = call(client, token, "heartbeat", beat(5, 40))
    stale = call(client, token, "heartbeat", beat(3, 20))
    attempt.refresh_from_db()

    assert replay.status_code == 200
    assert stale.status_code == 200
    assert attempt.step == 40
    assert attempt.last_seq == 5


def test_a_heartbeat_without_progress_for_the_stall_timeout_makes_the_attempt_due(client):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.watchdog import deadlines

    long_ago = timezone.now() - timedelta(hours=1)
    job = JobFactory(stall_timeout_s=600)
    since = {"registered_at": long_ago, "running_at": long_ago, "last_progress_at": long_ago}
    stuck, stuck_token = make_attempt(job, state="running", step=10, **since)
    moving, moving_token = make_attempt(
        JobFactory(stall_timeout_s=600), state="running", step=10, **since
    )

    call(client, stuck_token, "heartbeat", beat(1, 10))
    call(client, moving_token, "heartbeat", beat(1, 11))

    now = timezone.now()
    assert [loss.attempt_id for loss in deadlines.find_due_losses(now)] == [stuck.pk]
    assert deadlines.find_due_losses(now)[0].cause == "stalled"
    moving.refresh_from_db()
    assert moving.heartbeat_deadline > now
    assert moving.last_progress_at > long_ago


def test_a_bad_heartbeat_gets_422_saying_what_is_wrong(client):
    _, token = make_attempt()

    response = call(client, token, "heartbeat", {"seq": -1, "gpu": {"ok": True}})

    assert response.status_code == 422
    assert "seq" in json.dumps(response.json())


def gpu_row(index: int, **extra) -> dict:
    return {
        "index": index,
        "pci_bus_id": f"00000000:{index + 1:02X}:00.0",
        "name": "NVIDIA GeForce RTX 4090",
        "utilization_pct": 97.0,
        "memory_used_mib": 20123.0,
        "memory_total_mib": 24564.0,
        "temperature_c": 61.0,
        "ecc_uncorrected": None,
        "error": None,
        **extra,
    }


def test_register_says_how_many_gpus_the_job_has(client):
    _, token = make_attempt(JobFactory(requirements={"gpu_name": "RTX 4090", "num_gpus": 2}))

    body = call(client, token, "register", {"agent_version": "0.1"}).json()

    assert body["num_gpus"] == 2


def test_a_heartbeat_stores_each_gpus_health(client):
    attempt, token = make_attempt()
    lost = gpu_row(1, error="lost: GPU is lost", utilization_pct=None)
    gpu = {"ok": False, "error": "GPU 1 (0000:02:00.0) is lost", "gpus": [gpu_row(0), lost]}

    assert call(client, token, "heartbeat", beat(1, 5, gpu=gpu)).status_code == 200
    attempt.refresh_from_db()

    assert attempt.gpus == [gpu_row(0), lost]
    assert (attempt.gpu_ok, attempt.gpu_error) == (False, "GPU 1 (0000:02:00.0) is lost")
    call(client, token, "heartbeat", beat(2, 6))  # an older agent: no GPU rows
    attempt.refresh_from_db()
    assert attempt.gpus == []


@pytest.mark.parametrize(
    "gpus",
    [
        [gpu_row(i) for i in range(17)],  # more than any host has
        [gpu_row(0, name="x" * 101)],
        [gpu_row(0, pci_bus_id="0" * 33)],
        [gpu_row(0, error="e" * 301)],
        [gpu_row(0, utilization_pct=101)],
        [gpu_row(0, memory_used_mib=-1)],
        [{**gpu_row(0), "index": -1}],
        ["not an object"],
    ],
    ids=["17 gpus", "name", "bus id", "error", "utilisation", "memory", "index", "not object"],
)
def test_a_heartbeat_with_bad_gpu_rows_is_refused_and_nothing_stored(client, gpus):
    attempt, token = make_attempt()

    response = call(client, token, "heartbeat", beat(1, 5, gpu={"ok": True, "gpus": gpus}))
    attempt.refresh_from_db()

    assert response.status_code == 422
    assert "gpus" in json.dumps(response.json())
    assert (attempt.last_seq, attempt.step, attempt.gpus) == (-1, None, [])


def test_an_oversized_body_gets_413(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    _, token = make_attempt()

    response = call(client, token, "heartbeat", beat(1, 1, log_tail="x" * 4000))

    assert response.status_code == 413
    assert "larger than" in response.json()["detail"]


def test_checkpoint_now_is_delivered_once_and_stop_stays(client):
    attempt, token = make_attempt()
    Attempt.objects.filter(pk=attempt.pk).update(pending_command="checkpoint_now")

    first = call(client, token, "heartbeat", beat(1, 1)).json()["command"]
    second = call(client, token, "heartbeat", beat(2, 2)).json()["command"]
    Attempt.objects.filter(pk=attempt.pk).update(pending_command="stop")
    third = call(client, token, "heartbeat", beat(3, 3)).json()["command"]
    fourth = call(client, token, "heartbeat", beat(4, 4)).json()["command"]

    assert [first, second, third, fourth] == ["checkpoint_now", "continue", "stop", "stop"]


def upload_checkpoint(client, token: str, step: int, data: bytes) -> dict:
    plan = call(client, token, "checkpoints", {"step": step, "size": len(data)}).json()
    assert plan["upload"]["kind"] == "single"
    assert httpx.put(plan["upload"]["url"], content=data).status_code == 200
    done = call(
        client,
        token,
        f"checkpoints/{plan['checkpoint_id']}/complete",
        {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    )
    assert done.status_code == 200, done.content
    return plan


def test_a_checkpoint_becomes_ready_with_its_manifest_written(client, local_storage):
    attempt, token = make_attempt()

    plan = upload_checkpoint(client, token, 50, b"tar bytes" * 100)

    checkpoint = Checkpoint.objects.get(pk=plan["checkpoint_id"])
    assert checkpoint.state == CheckpointState.READY
    assert checkpoint.key.startswith(attempt.storage_prefix)
    manifest = json.loads((local_storage / checkpoint.key).with_name("manifest.json").read_text())
    assert manifest["sha256"] == checkpoint.sha256
    assert manifest["step"] == 50


def test_a_complete_with_the_wrong_size_is_refused(client, local_storage):
    _, token = make_attempt()
    plan = call(client, token, "checkpoints", {"step": 1, "size": 10}).json()
    httpx.put(plan["upload"]["url"], content=b"12345")

    response = call(
        client,
        token,
        f"checkpoints/{plan['checkpoint_id']}/complete",
        {"size": 10, "sha256": "0" * 64},
    )

    assert response.status_code == 409
    assert "5 bytes" in response.json()["detail"]


def test_multipart_parts_are_16_mib_unless_the_object_would_need_more_than_max_parts(
    client, local_storage
):
    _, token = make_attempt()
    gib, mib = 1024**3, 1024**2

    small = call(client, token, "checkpoints", {"step": 1, "size": gib}).json()["upload"]
    huge = call(client, token, "checkpoints", {"step": 2, "size": 400 * gib}).json()["upload"]

    assert small["kind"] == "multipart"
    assert small["part_size"] == 16 * mib
    assert len(small["parts"]) == 64
    assert huge["part_size"] % mib == 0
    assert len(huge["parts"]) <= 10_000
    assert huge["part_size"] * len(huge["parts"]) >= 400 * gib
    assert huge["part_size"] * (len(huge["parts"]) - 1) < 400 * gib


def test_the_next_attempt_resumes_from_the_newest_ready_checkpoint(client, local_storage):
    job = JobFactory()
    first, token = make_attempt(job)
    upload_checkpoint(client, token, 50, b"a" * 10)
    upload_checkpoint(client, token, 100, b"b" * 20)
    Attempt.objects.filter(pk=first.pk).update(state="ended")
    _, token_2 = make_attempt(job, number=2)

    resume = call(client, token_2, "register", {"agent_version": "0.1"}).json()["resume"]

    assert resume["step"] == 100
    assert httpx.get(resume["object"]["url"]).content == b"b" * 20
    assert resume["object"]["sha256"] == hashlib.sha256(b"b" * 20).hexdigest()


def test_old_checkpoints_are_pruned_to_keep_last(client, local_storage):
    job = JobFactory(keep_last=2)
    _, token = make_attempt(job)

    for step in (10, 20, 30):
        upload_checkpoint(client, token, step, b"x" * step)

    states = dict(Checkpoint.objects.filter(job=job).values_list("step", "state"))
    assert states == {10: "pruned", 20: "ready", 30: "ready"}


def test_a_fenced_attempt_cannot_ask_for_upload_targets(client, local_storage):
    attempt, token = make_attempt()
    Attempt.objects.filter(pk=attempt.pk).update(state="ended", end_reason="replaced")

    response = call(client, token, "checkpoints", {"step": 5, "size": 10})

    assert response.status_code == 410


def test_an_encrypted_job_refuses_plain_checkpoints(client, local_storage):
    _, token = make_attempt(JobFactory(encrypt_checkpoints=True))

    response = call(client, token, "checkpoints", {"step": 5, "size": 10, "encrypted": False})

    assert response.status_code == 409
    assert "encrypted" in response.json()["detail"]


def test_exit_is_recorded(client):
    attempt, token = make_attempt()

    call(client, token, "exit", {"exit_code": 1, "reason": "failed", "log_tail": "Traceback"})

    attempt.refresh_from_db()
    assert attempt.exit_code == 1
    assert attempt.log_tail == "Traceback"


def test_an_agent_that_arrives_before_its_instance_is_recorded_is_asked_to_retry(client):
    # The create's answer was lost; the reconciler will adopt the instance by its label.
    _, token = make_attempt(state="requested")

    response = call(client, token, "register", {"agent_version": "0.1"})

    assert response.status_code == 503
    assert "retry" in response.json()["detail"]
