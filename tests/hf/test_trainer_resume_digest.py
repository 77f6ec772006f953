"""A host lost at a checkpoint costs nothing but time: TRL's ``SFTTrainer`` (and the HF
``Trainer``) with ``NomadCallback``, under the real agent against the fake supervisor and moto
S3, is killed once checkpoint K is uploaded, resumed from K on a fresh host, and ends with the
same LoRA weights, bit for bit, as a run that was never interrupted.

The model is ``examples/qlora/train.py --tiny``: a random two-layer Qwen2 with LoRA on the CPU,
its tokenizer (for SFTTrainer) and data built in memory; nothing is downloaded. The portal's
``qlora-tiny`` template, its setup and command as the agent runs them, survives a drill (a kill
at whichever checkpoint the upload had reached) the same way.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors

from jobs.job_templates import template_spec
from tests.support.agent_fake_supervisor import Attempt, FakeJob, FakeSupervisor
from tests.support.agent_runs import steps_seen, tar_members
from tests.support.qlora import (
    HOLD,
    OFFLINE,
    TINY_FLAGS,
    TRAIN,
    finished,
    lose_the_host_once_ready,
    lose_the_host_past,
    ready_steps,
    run_to_the_end,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"  # raised inside peft
)

KILLED_AT, TOTAL = 8, 12  # checkpoints every 4 steps (TINY_FLAGS)


def tiny_command(trainer: str, *, hold_after: int | None = None) -> str:
    script = [str(HOLD), str(hold_after)] if hold_after else [str(TRAIN)]
    return shlex.join([sys.executable, *script, *TINY_FLAGS, "--trainer", trainer])


def final_adapter(supervisor: FakeSupervisor, attempt: Attempt) -> dict[str, torch.Tensor]:
    newest = supervisor.ready_checkpoints(attempt)[-1]
    assert newest.step == TOTAL
    members = tar_members(supervisor.s3.get(newest.key))
    return load_safetensors(members["adapter_model.safetensors"])


@pytest.mark.parametrize("trainer", ["sft", "hf"])
def test_killed_at_a_checkpoint_it_resumes_there_and_ends_with_the_unbroken_runs_weights(
    s3, tmp_path, trainer
):
    unbroken = FakeSupervisor(s3, FakeJob(tiny_command(trainer), dict(OFFLINE), total_steps=TOTAL))
    held = tiny_command(trainer, hold_after=KILLED_AT)
    broken = FakeSupervisor(s3, FakeJob(held, dict(OFFLINE), total_steps=TOTAL))
    try:
        reference = run_to_the_end(unbroken, tmp_path / "unbroken")
        lost = lose_the_host_once_ready(broken, tmp_path / "lost", KILLED_AT)
        broken.job.command = tiny_command(trainer)  # the replacement runs the plain script
        resumed = run_to_the_end(broken, tmp_path / "replacement")

        assert lost.exit is None  # killed, not finished
        assert max(steps_seen(lost), default=0) <= KILLED_AT
        assert ready_steps(broken, lost)[-1] == KILLED_AT
        tail = resumed.exit["log_tail"]
        assert f"resume-{KILLED_AT} at step {KILLED_AT}" in tail
        assert min(steps_seen(resumed)) > KILLED_AT
        step, digest = finished(resumed)
        assert (step, digest) == finished(reference) == (TOTAL, digest)
        ours, theirs = final_adapter(broken, resumed), final_adapter(unbroken, reference)
        assert sorted(ours) == sorted(theirs)
        assert all(torch.equal(ours[name], theirs[name]) for name in ours)
        print(f"{trainer}: adapter sha256 {digest}, unbroken and resumed from {KILLED_AT}")
    finally:
        unbroken.close()
        broken.close()


def test_the_tiny_qlora_template_as_the_agent_runs_it_survives_a_drill_with_the_same_weights(
    s3, tmp_path
):
    spec = template_spec("qlora-tiny")
    # Its setup (packages present here: nothing installed) and command, as the portal offers
    # them; shorter and faster than its minute so that the test stays short.
    env = {**spec["env"], **OFFLINE, "QLORA_SAVE_STEPS": "10", "QLORA_STEP_SECONDS": "0.05"}
    # Its `python` is this interpreter, as the sandbox's instance venv sees this environment.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

    def job() -> FakeJob:
        return FakeJob(spec["command"], dict(env), total_steps=60, setup=spec["setup"])

    unbroken, drilled = FakeSupervisor(s3, job()), FakeSupervisor(s3, job())
    try:
        reference = run_to_the_end(unbroken, tmp_path / "unbroken")
        lost = lose_the_host_past(drilled, tmp_path / "lost", 10)
        resumed = run_to_the_end(drilled, tmp_path / "replacement")

        resumed_from = max(ready_steps(drilled, lost))
        assert 10 < resumed_from < 60
        assert min(steps_seen(resumed)) > resumed_from  # restored, not started over
        assert finished(resumed) == finished(reference)
        assert finished(reference)[0] == 60
        print(f"qlora-tiny: adapter sha256 {finished(resumed)[1]}, resumed from {resumed_from}")
    finally:
        unbroken.close()
        drilled.close()
