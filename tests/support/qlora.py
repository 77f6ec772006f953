"""The tiny QLoRA run the Hugging Face tests share (``examples/qlora/train.py --tiny``: a random
two-layer Qwen2 with LoRA on the CPU, nothing downloaded): its flags and offline environment,
runs under the real agent against the fake supervisor (to the end, or lost once a checkpoint is
ready), the step and adapter digest it prints last, and the portal's ``qlora-tiny`` template
shortened for the sandbox with the digest of an uninterrupted run.

No torch here: tests/hf/ imports it, and only ``make test-hf`` installs torch."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from jobs.job_templates import template_spec
from jobs.spec import JobSpec
from tests.support.agent_fake_supervisor import Attempt, FakeSupervisor, start_agent
from tests.support.processes import ROOT, wait_until

QLORA = ROOT / "examples" / "qlora"
TRAIN = QLORA / "train.py"
TINY_FLAGS = ["--tiny", "--save-steps", "4", "--batch-size", "2", "--grad-accum", "1"]
# The command's environment: nothing may reach a hub, and two cores are shared.
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# train.py, stopped once checkpoint K is uploaded and ready (a host that is about to be lost).
HOLD = ROOT / "tests" / "hf" / "hold_after_checkpoint.py"
FINISHED = re.compile(r"finished at step (\d+), adapter sha256 ([0-9a-f]{64})")


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
    # The template names `python` (in the sandbox, the instance's venv over this interpreter's
    # environment): here, this interpreter.
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    result = subprocess.run(
        shlex.split(spec.command), env={"PATH": path, **env}, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return FINISHED.search(output)[2]
