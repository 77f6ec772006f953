"""Staged weights end to end: a fake Hub serving a tiny model (and a gated one), the team's
storage backend (local, or S3 on moto's server), a job whose stage entry is already mirrored,
and the real agent run once on it. A plugin (``tests/conftest.py``): the ``hub`` and ``backend``
fixtures serve tests/test_staging.py and tests/hf/; a module with its own fixture of the same
name (``tests/e2e/test_staged_weights.py``, ``tests/test_agent_live.py``) keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.utils import timezone

from jobs.models import Attempt, Job, JobState
from jobs.staging import stage
from tests.support import hub_fake
from tests.support.factories import JobFactory
from tests.support.processes import ROOT

CONFIG = b'{"model_type": "qwen2", "hidden_size": 64}'
TOKENIZER = b'{"version": "1.0", "model": {"type": "BPE"}}'
# Over checkpoints.RANGED_MIN_SIZE (8 MiB): the agent fetches it over parallel ranged GETs.
WEIGHTS = os.urandom(9 * 1024 * 1024 + 123)
TINY = "org/tiny-model"
GATED = "org/gated-model"
TINY_ENTRY = {"hf": TINY, "revision": "main", "files": ["*.json", "*.safetensors"]}


def tiny_repo() -> hub_fake.Repo:
    files = {"config.json": CONFIG, "tokenizer.json": TOKENIZER, "model.safetensors": WEIGHTS}
    return hub_fake.Repo(files={**files, "README.md": b"# tiny"})


@pytest.fixture
def hub(settings):
    fake = hub_fake.FakeHub(
        repos={TINY: tiny_repo(), GATED: hub_fake.Repo(files={"config.json": CONFIG}, gated=True)}
    )
    with hub_fake.running(fake):
        settings.HF_ENDPOINT = fake.url
        yield fake


@pytest.fixture(params=["local", "s3"])
def backend(request, settings, live_server, tmp_path):
    settings.SITE_URL = live_server.url
    if request.param == "local":
        settings.STORAGE_BACKEND = "local"
        settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
        return request.param
    bucket = request.getfixturevalue("s3_bucket")
    settings.STORAGE_BACKEND = "s3"
    settings.S3_BUCKET = bucket["bucket"]
    settings.S3_ENDPOINT_URL = bucket["endpoint_url"]
    settings.S3_ACCESS_KEY_ID = bucket["access_key_id"]
    settings.S3_SECRET_ACCESS_KEY = bucket["secret_access_key"]
    settings.S3_REGION = bucket["region"]
    return request.param


def staged_job(encrypted: bool, command: str, *more: dict) -> Job:
    """A job whose TINY_ENTRY is mirrored (the worker's function, called here directly)."""
    from nomadgpu.crypto import new_data_key

    job = JobFactory(
        state=JobState.QUEUED,
        command=command,
        stage=[TINY_ENTRY, *more],
        stage_state="staging",
        encrypt_checkpoints=encrypted,
        data_key=new_data_key() if encrypted else "",
        heartbeat_interval_s=1,
    )
    assert stage.stage_job(job.pk, now=timezone.now()) == "ready"
    # The rent planned after staging is this test's own host instead.
    Attempt.objects.filter(job=job).delete()
    Job.objects.filter(pk=job.pk).update(state=JobState.QUEUED)
    return Job.objects.get(pk=job.pk)


def run_agent(live_server, token: str, workdir) -> subprocess.CompletedProcess:
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
        timeout=120,
    )
