"""The staged cache as the Hugging Face libraries read it: the worker mirrors a repo from the
fake Hub, the real agent lays it out, and the command (offline, as the agent runs it) loads it
with ``huggingface_hub.snapshot_download(local_files_only=True)`` and ``transformers.AutoConfig``
by repo id and revision, as a training script's ``from_pretrained`` would."""

from __future__ import annotations

import sys

import pytest

from tests.support.factories import make_attempt
from tests.support.staging import run_agent, staged_job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOAD = """
import os
from pathlib import Path
from huggingface_hub import snapshot_download
from transformers import AutoConfig
assert os.environ["HF_HUB_OFFLINE"] == "1"
folder = Path(snapshot_download("org/tiny-model", revision="main", local_files_only=True))
names = sorted(p.name for p in folder.iterdir())
assert names == ["config.json", "model.safetensors", "tokenizer.json"], names
config = AutoConfig.from_pretrained("org/tiny-model", revision="main")
print("loaded offline:", config.model_type, config.hidden_size, flush=True)
"""


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_huggingface_libraries_find_the_staged_snapshot_offline(
    hub,
    backend,
    live_server,
    tmp_path,
    monkeypatch,
):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    job = staged_job(False, f"{sys.executable} {script}")
    attempt, token = make_attempt(job, state="starting")

    result = run_agent(live_server, token, tmp_path / "host")

    attempt.refresh_from_db()
    assert result.returncode == 0, attempt.log_tail[-3000:]
    assert "loaded offline: qwen2 64" in attempt.log_tail
