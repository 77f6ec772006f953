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

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors

from jobs.spec import template_spec
from tests.hf.test_hf_callback import OFFLINE, TINY_FLAGS, TRAIN
from tests.support.agent_fake_supervisor import Attempt, FakeJob, FakeSupervisor, start_agent
from tests.support.processes import wait_until
from tests.test_agent_runtime import steps_seen, tar_members

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"  # raised inside peft
)

HOLD = Path(__file__).with_name("hold_after_checkpoint.py")
KILLED_AT, TOTAL = 8, 12  # checkpoints every 4 steps (TINY_FLAGS)
FINISHED = re.compile(r"finished at step (\d+), adapter sha256 ([0-9a-f]{64})")


def tiny_command(trainer: str, *, hold_after: int | None = None) -> str:
    script = [str(HOLD), str(hold_after)] if hold_after else [str(TRAIN)]
    return shlex.join([sys.executable, *script, *TINY_FLAGS, "--trainer", trainer])


def run_to_the_end(supervisor: FakeSupervisor, workdir: Path) -> Attempt:
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, workdir)
    try:
        assert run.wait(180) == 0, run.log()
    finally:
        run.stop()
    assert attempt.exit["reason"] == "finished", attempt.exit
    return attempt


def lose_the_host_once_ready(supervisor: FakeSupervisor, workdir: Path, step: int) -> Attempt:
    """Run until checkpoint STEP is uploaded and ready, then SIGKILL the agent and the command:
    the host is gone, with no exit call and nothing flushed."""
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, workdir)
    try:
        wait_until(
            lambda: run.proc.poll() is not None or step in ready_steps(supervisor, attempt),
            timeout=180,
            what=f"checkpoint {step} to be uploaded",
        )
        assert run.proc.poll() is None, run.log()
    finally:
        run.stop()
    return attempt


def lose_the_host_past(supervisor: FakeSupervisor, workdir: Path, step: int) -> Attempt:
    """Run until a checkpoint past STEP is ready, then SIGKILL the agent and the command, as
    a drill does: the newest ready checkpoint is whichever the upload had reached."""
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, workdir)
    try:
        wait_until(
            lambda: (
                run.proc.poll() is not None
                or max(ready_steps(supervisor, attempt), default=0) > step
            ),
            timeout=180,
            what=f"a checkpoint past step {step}",
        )
        assert run.proc.poll() is None, run.log()
    finally:
        run.stop()
    return attempt


def finished(attempt: Attempt) -> tuple[int, str]:
    """(final step, adapter digest) as train.py printed them last."""
    match = FINISHED.search(attempt.exit["log_tail"])
    assert match, attempt.exit["log_tail"]
    return int(match[1]), match[2]


def ready_steps(supervisor: FakeSupervisor, attempt: Attempt) -> list[int]:
    return [c.step for c in supervisor.ready_checkpoints(attempt)]


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
