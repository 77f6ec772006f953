"""Measure 5 of issue 30, overlap: the agent restores the resume checkpoint while the job's
setup runs (the real agent as a subprocess against the live fake supervisor and a real S3
protocol server, the toy trainer), and each phase's errors still end the attempt as before."""

from __future__ import annotations

import pytest

from tests.support.agent_fake_supervisor import (
    FakeJob,
    FakeSupervisor,
    start_agent,
    toy_command,
)

FAST = {"TOY_STEP_SECONDS": "0.05", "TOY_STEPS": "10", "TOY_CHECKPOINT_EVERY": "10"}
# A setup that finishes only once the checkpoint is restored beside it (its folder appears),
# and gives up after 20 s: with a restore that waits for setup, it fails.
SETUP_WAITS_FOR_THE_RESTORE = """\
echo "setup: installing requirements"
for i in $(seq 1 400); do
  if [ -d "$NOMAD_CHECKPOINT_DIR/resume-10" ]; then echo "setup saw the restore"; exit 0; fi
  sleep 0.05
done
echo "setup: no restore beside me" >&2
exit 7
"""


@pytest.fixture
def supervisor(s3):
    made = FakeSupervisor(s3, FakeJob(command=toy_command(), env=dict(FAST)))
    yield made
    made.close()


@pytest.fixture
def runs():
    started = []
    yield started
    for run in started:
        run.stop()


def first_attempt_checkpoints(supervisor, runs, tmp_path) -> None:
    """A first attempt trains to step 10 and ships that checkpoint, to resume from."""
    first = supervisor.new_attempt()
    run = start_agent(supervisor, first, tmp_path / "one")
    runs.append(run)
    assert run.wait(60) == 0, run.log()
    assert [c.step for c in supervisor.ready_checkpoints(first)] == [10]


def boundaries(attempt) -> dict[str, float]:
    """Each phase boundary as a moment on the test's clock (the call's arrival minus its age)."""
    moments: dict[str, float] = {}
    for beat in attempt.heartbeats:
        for name, age in (beat.get("phases") or {}).items():
            moments.setdefault(name, beat["received_at"] - age)
    return moments


def second_attempt(supervisor, runs, tmp_path, *, setup: str, steps: int = 20):
    supervisor.job.setup = setup
    supervisor.job.env["TOY_STEPS"] = str(steps)
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "two")
    runs.append(run)
    return attempt, run, run.wait(60)


def test_the_checkpoint_is_restored_while_setup_runs(supervisor, runs, tmp_path):
    first_attempt_checkpoints(supervisor, runs, tmp_path)

    attempt, run, code = second_attempt(
        supervisor, runs, tmp_path, setup=SETUP_WAITS_FOR_THE_RESTORE
    )

    assert code == 0, run.log()
    tail = attempt.exit["log_tail"]
    assert "setup: installing requirements" in tail  # setup's output still in the tail
    assert "setup saw the restore" in tail
    assert "resumed from step 10" in tail
    moments = boundaries(attempt)
    # The restore ended inside setup: its last byte and unpack came before setup was done.
    assert moments["workdir_ready"] - 0.05 <= moments["restore_unpacked"]
    assert moments["restore_unpacked"] <= moments["setup_done"] + 0.05
    assert moments["setup_done"] <= moments["command_started"] + 0.05


def test_the_job_env_can_restore_after_setup_as_before(supervisor, runs, tmp_path):
    first_attempt_checkpoints(supervisor, runs, tmp_path)
    supervisor.job.env["NOMADGPU_RESTORE_OVERLAP"] = "0"

    attempt, run, code = second_attempt(
        supervisor, runs, tmp_path, setup=SETUP_WAITS_FOR_THE_RESTORE
    )

    assert code == 5, run.log()
    assert (attempt.exit["reason"], attempt.exit["exit_code"]) == ("setup_failed", 7)


def test_a_failing_setup_still_fails_the_attempt_while_the_restore_runs(supervisor, runs, tmp_path):
    first_attempt_checkpoints(supervisor, runs, tmp_path)

    attempt, run, code = second_attempt(
        supervisor, runs, tmp_path, setup="echo 'no such package: torchh' >&2\nexit 3\n"
    )

    assert code == 5, run.log()
    assert (attempt.exit["reason"], attempt.exit["exit_code"]) == ("setup_failed", 3)
    assert "no such package: torchh" in attempt.exit["log_tail"]
    assert "started command" not in run.log()


def test_a_corrupt_checkpoint_is_still_an_agent_error_after_setup_ran(
    supervisor, runs, s3, tmp_path
):
    first_attempt_checkpoints(supervisor, runs, tmp_path)
    (ckpt,) = supervisor.ready_checkpoints(supervisor.attempts[1])
    data = bytearray(s3.get(ckpt.key))
    data[700] ^= 1
    s3.client.put_object(Bucket=s3.bucket, Key=ckpt.key, Body=bytes(data))

    attempt, run, code = second_attempt(
        supervisor, runs, tmp_path, setup="echo setup-finished > setup-ran"
    )

    assert code == 4, run.log()
    assert attempt.exit["reason"] == "agent_error"
    assert "sha256" in attempt.exit["error"]
    assert (tmp_path / "two" / "setup-ran").exists()  # setup ran to its end beside it
    assert "started command" not in run.log()
