"""The real agent against the live web process: local storage (signed by the web process) and
S3 (moto's server over HTTP), plain and encrypted; resume, failure exit codes, a part upload
interrupted and retried."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from jobs.checkpoints import records
from jobs.models import Checkpoint, JobState
from nomadgpu.storage import object_store
from tests.support.factories import JobFactory, make_attempt
from tests.support.processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TOY = f"{sys.executable} {ROOT}/examples/toy/train.py"
FAST = {"TOY_STEP_SECONDS": "0.01", "TOY_STEPS": "60", "TOY_CHECKPOINT_EVERY": "20"}


@pytest.fixture(params=["local", "s3"])
def backend(request, settings, live_server, tmp_path):
    settings.SITE_URL = live_server.url
    if request.param == "local":
        settings.STORAGE_BACKEND = "local"
        settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    else:
        bucket = request.getfixturevalue("s3_bucket")
        settings.STORAGE_BACKEND = "s3"
        settings.S3_BUCKET = bucket["bucket"]
        settings.S3_ENDPOINT_URL = bucket["endpoint_url"]
        settings.S3_ACCESS_KEY_ID = bucket["access_key_id"]
        settings.S3_SECRET_ACCESS_KEY = bucket["secret_access_key"]
        settings.S3_REGION = bucket["region"]
    return request.param


def run_agent(
    live_server, token: str, workdir, timeout: float = 120
) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "NOMAD_SUPERVISOR_URL": live_server.url,
        "NOMAD_AGENT_TOKEN": token,
        "NOMAD_WORKDIR": str(workdir),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "agent"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def toy_job(**fields):
    defaults = {"command": TOY, "env": dict(FAST), "heartbeat_interval_s": 1, "total_steps": 60}
    return JobFactory(state=JobState.STARTING, **{**defaults, **fields})


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_checkpoints_upload_verify_and_restore_on_a_second_attempt(
    backend, encrypted, live_server, tmp_path
):
    from nomadgpu.crypto import new_data_key

    job = toy_job(encrypt_checkpoints=encrypted, data_key=new_data_key() if encrypted else "")
    _, token = make_attempt(job, state="starting")
    job.env = {**FAST, "TOY_STEPS": "40"}  # the first host finishes step 40 and exits
    job.save()

    result = run_agent(live_server, token, tmp_path / "a1")

    assert result.returncode == 0, result.stderr[-3000:]
    ready = Checkpoint.objects.filter(job=job, state="ready").order_by("step")
    # Step 40 always arrives; 20 only if it was shipped before 40 superseded it.
    steps = [c.step for c in ready]
    assert steps[-1] == 40
    assert set(steps) <= {20, 40}
    store = object_store(job.team)
    for checkpoint in ready:
        body = store.open_read(checkpoint.key).read()
        assert hashlib.sha256(body).hexdigest() == checkpoint.sha256
        assert checkpoint.encrypted is encrypted
        assert (body[:4] == b"NGCK") is encrypted
    # A second host resumes from step 40 (the job continues: 60 steps in all).
    job.refresh_from_db()
    job.state, job.env = JobState.STARTING, dict(FAST)
    job.save()
    second, token_2 = make_attempt(job, number=2, state="starting")

    result = run_agent(live_server, token_2, tmp_path / "a2")

    assert result.returncode == 0, result.stderr[-3000:]
    second.refresh_from_db()
    assert second.resumed_from_step == 40
    assert "resumed from step 40" in second.log_tail
    assert "final-digest: " in second.log_tail


def test_a_command_exiting_with_3_is_reported_as_3_and_fails_the_job(
    backend, live_server, tmp_path, monkeypatch
):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    job = toy_job(command="echo 'ValueError: bad config'; exit 3")
    attempt, token = make_attempt(job, state="starting")

    result = run_agent(live_server, token, tmp_path / "a")

    attempt.refresh_from_db()
    job.refresh_from_db()
    assert result.returncode == 3
    assert attempt.exit_code == 3
    assert job.state == JobState.FAILED
    assert "bad config" in attempt.log_tail


def test_a_part_upload_interrupted_midway_is_retried_and_completes(
    settings, live_server, tmp_path, monkeypatch
):
    from nomadgpu.storage import LocalObjectStore

    settings.SITE_URL = live_server.url
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    monkeypatch.setattr(records, "SINGLE_PUT_LIMIT", 64 * 1024)
    monkeypatch.setattr(records, "PART_SIZE", 64 * 1024)
    original = LocalObjectStore.write_part
    calls = []

    def drop_the_first_part_midway(self, key, upload_id, part_number, chunks, **guard):
        calls.append(part_number)
        if len(calls) == 1:
            next(chunks)  # half a body arrived, then the connection "dropped"
            raise ConnectionResetError("simulated network drop during a part upload")
        return original(self, key, upload_id, part_number, chunks, **guard)

    monkeypatch.setattr(LocalObjectStore, "write_part", drop_the_first_part_midway)
    job = toy_job(env={**FAST, "TOY_STEPS": "20", "TOY_WEIGHTS_KB": "200"})
    _, token = make_attempt(job, state="starting")

    result = run_agent(live_server, token, tmp_path / "a")

    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = Checkpoint.objects.get(job=job, step=20)
    assert checkpoint.state == "ready"
    assert checkpoint.upload_id  # it went multipart
    body = (tmp_path / "objects" / checkpoint.key).read_bytes()
    assert hashlib.sha256(body).hexdigest() == checkpoint.sha256
    assert calls.count(1) == 2  # the interrupted part was sent again
