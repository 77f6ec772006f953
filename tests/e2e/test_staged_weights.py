"""Staged model weights end to end: a toy job stages a Hugging Face repo (from the local fake
Hub); the worker mirrors it into the team's storage before the first rent; on the first host
and on the replacement after a destroy, the agent lays out the Hub's cache before the command,
which finds the snapshot's exact bytes with ``HF_HUB_OFFLINE=1`` and then trains. The bytes
cross the sandbox's metered proxy on each host, and the recovery's anatomy has its model
download phase."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from jobs import anatomy
from jobs.models import Interruption, JobState
from tests.support import hub_fake
from tests.support.processes import ROOT
from tests.support.toy import toy_env
from tests.support.waiting import wait_checkpoint, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CONFIG = b'{"model_type": "qwen2", "hidden_size": 64}'
WEIGHTS = os.urandom(9 * 1024 * 1024)  # over the ranged-GET threshold (8 MiB)
REPO = "org/tiny-model"

# The command: the cache is complete and offline before the toy trains.
RUN = f"""
import hashlib, os, runpy, sys
from pathlib import Path
assert os.environ["HF_HUB_OFFLINE"] == "1"
repo = Path(os.environ["HF_HOME"]) / "hub" / "models--org--tiny-model"
commit = (repo / "refs" / "main").read_text()
snap = repo / "snapshots" / commit
assert hashlib.sha256((snap / "config.json").read_bytes()).hexdigest() == "{hashlib.sha256(CONFIG).hexdigest()}"
assert hashlib.sha256((snap / "model.safetensors").read_bytes()).hexdigest() == "{hashlib.sha256(WEIGHTS).hexdigest()}"
print("staged cache ok at", commit, flush=True)
sys.argv = ["train.py"]
runpy.run_path("{ROOT}/examples/toy/train.py", run_name="__main__")
"""  # noqa: E501


@pytest.fixture
def hub(settings):
    repo = hub_fake.Repo(files={"config.json": CONFIG, "model.safetensors": WEIGHTS})
    with hub_fake.running(hub_fake.FakeHub(repos={REPO: repo})) as fake:
        settings.HF_ENDPOINT = fake.url
        yield fake


def command_output(sandbox, attempt) -> str:
    """What the command printed on ATTEMPT's host (the agent's train.log in its scratch)."""
    scratch = Path(sandbox.debug(attempt.instance_id)["scratch"])
    return "".join(p.read_text(errors="replace") for p in scratch.rglob("train.log*"))


def test_staged_weights_reach_the_first_host_and_its_replacement_offline(supervisor, hub, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    job = supervisor.submit_toy(
        command=f"{sys.executable} {script}",
        env=toy_env(steps=120, every=20, step_seconds=0.05),
        total_steps=120,
        stage=[{"hf": REPO, "revision": "main"}],
    )
    first = wait_running(job, 1, timeout=90)
    job.refresh_from_db()
    assert job.stage_state == "ready"
    commit = hub.repos[REPO].commit
    wait_checkpoint(job, above=0)
    assert f"staged cache ok at {commit}" in command_output(supervisor.sandbox, first)

    supervisor.sandbox.inject(first.instance_id, "destroy")

    second = wait_running(job, 2, timeout=120)
    wait_state(job, JobState.SUCCEEDED, timeout=120)
    second.refresh_from_db()
    assert f"staged cache ok at {commit}" in command_output(supervisor.sandbox, second)
    assert sum(hub.served.values()) == len(CONFIG) + len(WEIGHTS)  # mirrored once, for both
    # Each host's bytes crossed the sandbox's metered proxy.
    assert supervisor.sandbox.debug(second.instance_id)["usage"]["down_bytes"] >= len(WEIGHTS)
    interruption = Interruption.objects.get(attempt=first)
    assert interruption.replacement == second
    assert second.stage_done_at is not None
    assert anatomy.breakdown(interruption)["phases"]["stage"] is not None
