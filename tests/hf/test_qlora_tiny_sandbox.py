"""The portal's ``qlora-tiny`` template submitted in the sandbox as a member would: it trains the
tiny random Qwen2 + LoRA on the CPU, loses its host in a fire drill, resumes from its newest
checkpoint on a replacement, and ends with the same adapter weights as an uninterrupted run."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
from django.utils import timezone

from jobs import drill
from jobs.models import JobState
from jobs.spec import JobSpec, submit_spec, template_spec
from tests.e2e.conftest import wait_checkpoint, wait_running, wait_state
from tests.support.processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FINISHED = re.compile(r"finished at step (\d+), adapter sha256 ([0-9a-f]{64})")
# The template as offered, shortened for the test: 80 steps, a checkpoint every 10.
FASTER = {"QLORA_SAVE_STEPS": "10", "QLORA_STEP_SECONDS": "0.1", "TRANSFORMERS_OFFLINE": "1"}


def tiny_spec() -> JobSpec:
    spec = template_spec("qlora-tiny")
    spec.update(total_steps=80, heartbeat_interval_s=1, env={**spec["env"], **FASTER})
    spec["requirements"] = {**spec["requirements"], "rental": "on-demand"}
    return JobSpec(**spec)


def uninterrupted_digest(spec: JobSpec, tmp_path) -> str:
    """The adapter digest of the same command run once, start to end, without an agent."""
    env = {
        **spec.env,
        "NOMAD_CHECKPOINT_DIR": str(tmp_path / "unbroken"),
        "QLORA_STEP_SECONDS": "0",
    }
    env["NOMAD_TOTAL_STEPS"] = str(spec.total_steps)
    env["PYTHONPATH"] = str(ROOT)  # the agent puts its own package there (agent.hf)
    result = subprocess.run(
        shlex.split(spec.command), env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return FINISHED.search(output)[2]


def test_the_tiny_qlora_template_survives_a_drill_with_the_uninterrupted_weights(
    supervisor, tmp_path
):
    spec = tiny_spec()
    job = submit_spec(spec, team=supervisor.team, created_by=supervisor.user, now=timezone.now())

    first = wait_running(job, 1, timeout=300)
    wait_checkpoint(job, attempt=first, above=0)
    result = drill.drill_once(job, timeout_s=300, say=lambda line: None)
    wait_state(job, JobState.SUCCEEDED, timeout=600)

    assert result.resumed_step > 0  # from a checkpoint, not from the start
    last = job.attempts.order_by("-number").first()
    assert last.number == 2
    step, digest = FINISHED.search(last.log_tail).groups()
    assert int(step) == 80
    assert digest == uninterrupted_digest(spec, tmp_path)
    print(f"qlora-tiny in the sandbox: resumed from {result.resumed_step}, adapter {digest}")
