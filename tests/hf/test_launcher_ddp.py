"""Jobs on several GPUs of one host: ``launcher = "torchrun"`` with ``num_gpus = 2`` runs
``examples/qlora/train.py --tiny`` as two ranks (HF ``Trainer`` DDP, gloo on the CPU) under the
real agent against the fake supervisor and moto S3.

- A host lost once checkpoint K is ready: the replacement resumes both ranks from K and ends
  with the adapter of a two-rank run that was never interrupted, bit for bit.
- A checkpoint request reaches the ranks (each in a session of its own under torchrun) and all
  of them save at the same step: the checkpoint is complete (each rank's RNG state) and ready.
- Rank 1 crashing is the job's own error: ``failed``, the error names rank 1, and its traceback
  is in the log tail.
- Rank 1 hanging stops the steps rank 0 reports while the agent beats on: the stall rule
  (``jobs.watchdog.stall``) finds the attempt stalled.
"""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors

from jobs.watchdog.stall import is_stalled
from tests.support.agent_fake_supervisor import Attempt, FakeJob, FakeSupervisor, start_agent
from tests.support.agent_runs import steps_seen, tar_members
from tests.support.processes import wait_until
from tests.support.qlora import (
    HOLD,
    OFFLINE,
    TINY_FLAGS,
    TRAIN,
    finished,
    lose_the_host_once_ready,
    ready_steps,
    run_to_the_end,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"  # raised inside peft
)

TROUBLE = Path(__file__).with_name("rank_trouble.py")
KILLED_AT, TOTAL = 4, 8  # checkpoints every 4 steps (TINY_FLAGS)
RANKS = {"launcher": "torchrun", "num_gpus": 2}


def script(*head: str, steps: int = TOTAL) -> str:
    """The job's command under a launcher: the interpreter, a script and its flags."""
    return shlex.join([sys.executable, *head, *TINY_FLAGS, "--steps", str(steps)])


def two_ranks(s3, command: str, **more) -> FakeSupervisor:
    job = FakeJob(command, dict(OFFLINE), total_steps=TOTAL, **RANKS, **more)
    return FakeSupervisor(s3, job)


def final_adapter(supervisor: FakeSupervisor, attempt: Attempt) -> dict[str, torch.Tensor]:
    newest = supervisor.ready_checkpoints(attempt)[-1]
    assert newest.step == TOTAL
    return load_safetensors(tar_members(supervisor.s3.get(newest.key))["adapter_model.safetensors"])


def test_two_ranks_killed_at_a_checkpoint_resume_there_with_the_unbroken_runs_weights(s3, tmp_path):
    unbroken = two_ranks(s3, script(str(TRAIN)))
    broken = two_ranks(s3, script(str(HOLD), str(KILLED_AT)))
    try:
        reference = run_to_the_end(unbroken, tmp_path / "unbroken")
        lost = lose_the_host_once_ready(broken, tmp_path / "lost", KILLED_AT)
        broken.job.command = script(str(TRAIN))  # the replacement runs the plain script
        resumed = run_to_the_end(broken, tmp_path / "replacement")

        assert "torch.distributed.run --standalone --nproc_per_node=2" in reference.exit["log_tail"]
        assert lost.exit is None  # killed, not finished
        assert ready_steps(broken, lost)[-1] == KILLED_AT
        newest = broken.ready_checkpoints(lost)[-1]
        members = tar_members(broken.s3.get(newest.key))
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(members)  # both ranks' parts
        assert f"resume-{KILLED_AT} at step {KILLED_AT}" in resumed.exit["log_tail"]
        assert min(steps_seen(resumed)) > KILLED_AT
        assert finished(resumed) == finished(reference)
        assert finished(reference)[0] == TOTAL
        ours, theirs = final_adapter(broken, resumed), final_adapter(unbroken, reference)
        assert sorted(ours) == sorted(theirs)
        assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    finally:
        unbroken.close()
        broken.close()


def test_a_checkpoint_request_reaches_the_ranks_and_all_save_at_the_same_step(s3, tmp_path):
    # Saves only when asked (auto mode), paced so that the request lands mid-run.
    env = {"QLORA_STEP_SECONDS": "0.5"}
    supervisor = two_ranks(s3, script(str(TRAIN), steps=40), checkpoint_mode="auto")
    supervisor.job.env.update(env)
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "host")
    try:
        wait_until(
            lambda: run.proc.poll() is not None or max(steps_seen(attempt), default=0) >= 2,
            timeout=120,
            what="two steps",
        )
        supervisor.command(attempt, "checkpoint_now")
        wait_until(
            lambda: run.proc.poll() is not None or ready_steps(supervisor, attempt),
            timeout=60,
            what="the requested checkpoint",
        )
        step = ready_steps(supervisor, attempt)[0]
        assert 2 <= step < 40  # saved when asked, not at the end
        members = tar_members(supervisor.s3.get(supervisor.ready_checkpoints(attempt)[0].key))
        assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(members)
        assert f'"global_step": {step}' in members["trainer_state.json"].decode()
    finally:
        run.stop()
        supervisor.close()


def test_a_rank_that_crashes_fails_the_job_with_that_ranks_traceback(s3, tmp_path):
    supervisor = two_ranks(s3, script(str(TROUBLE), "crash", "3"))
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "host")
    try:
        assert run.wait(180) != 0, run.log()
    finally:
        run.stop()
        supervisor.close()
    body = attempt.exit
    assert body["reason"] == "failed", body  # the job's error, not a lost host
    assert body["exit_code"] not in (None, 0)
    assert body["error"] == "rank 1 exited with code 1"
    tail = body["log_tail"]
    assert len(tail.encode()) <= 8 * 1024
    head, _, rest = tail.partition("\n")
    assert head == "[nomad-agent] rank 1's last lines:"
    assert "[rank1]: RuntimeError: rank 1 fails at step 3 on purpose" in tail
    assert "rank      : 1 (local_rank: 1)" in rest  # torchrun's summary, after them
    assert "rank 1 exited with code 1" in tail.splitlines()[-1]


def test_a_rank_that_hangs_is_found_stalled_by_the_stall_rule(s3, tmp_path):
    stall_timeout_s = 4.0
    supervisor = two_ranks(s3, script(str(TROUBLE), "hang", "3"))
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "host")
    try:
        wait_until(
            lambda: run.proc.poll() is not None or "rank 1 hangs at step 3" in run_output(run),
            timeout=120,
            what="rank 1 to hang",
        )
        # Beats go on (the host is fine) while no step comes: wait out the stall timeout.
        wait_until(
            lambda: run.proc.poll() is not None or stalled_for(attempt) > stall_timeout_s + 1,
            timeout=60,
            what="a stall's worth of beats without a new step",
        )
        assert run.proc.poll() is None, run.log()
    finally:
        run.stop()
        supervisor.close()
    beats = attempt.heartbeats
    last = beats[-1]
    assert last["phase"] == "running"
    assert last["step"] is not None
    assert last["step"] <= 3
    rose = progress_time(beats)
    assert is_stalled(
        phase=last["phase"],
        step_before=last["step"],
        step_now=last["step"],
        last_progress_at=at(rose),
        running_at=at(beats[0]["received_at"]),
        stall_timeout_s=stall_timeout_s,
        now=at(last["received_at"]),
    )


def run_output(run) -> str:
    log = run.workdir / "logs" / "train.log"
    return log.read_text(errors="replace") if log.exists() else ""


def progress_time(beats: list[dict]) -> float:
    """When the reported step last rose (the stall rule's last progress)."""
    rose, best = beats[0]["received_at"], None
    for beat in beats:
        if beat.get("step") is not None and (best is None or beat["step"] > best):
            best, rose = beat["step"], beat["received_at"]
    return rose


def stalled_for(attempt: Attempt) -> float:
    beats = list(attempt.heartbeats)
    if not beats or beats[-1].get("step") is None:
        return 0.0
    return beats[-1]["received_at"] - progress_time(beats)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)
