"""The real agent (a subprocess) reports its phase boundaries to a live fake supervisor: the
bootstrap's moments at register, the code and setup, the restore, the command's start and its
first step on the heartbeats, each until a call carrying it was answered."""

from __future__ import annotations

import time

import pytest

from tests.support.agent_fake_supervisor import (
    FakeJob,
    FakeS3,
    FakeSupervisor,
    start_agent,
    toy_command,
)

FAST = {"TOY_STEP_SECONDS": "0.05"}


@pytest.fixture
def supervisor():
    s3 = FakeS3()
    made = FakeSupervisor(
        s3,
        FakeJob(
            command=toy_command(), env={**FAST, "TOY_STEPS": "10", "TOY_CHECKPOINT_EVERY": "5"}
        ),
    )
    yield made
    made.close()
    s3.close()


def reported(attempt) -> dict[str, list[float]]:
    """Every phase age the heartbeats carried, by name."""
    out: dict[str, list[float]] = {}
    for beat in attempt.heartbeats:
        for name, age in (beat.get("phases") or {}).items():
            out.setdefault(name, []).append(age)
    return out


def test_a_resuming_agent_reports_each_boundary_once_it_is_known(supervisor, tmp_path):
    first = supervisor.new_attempt()
    run = start_agent(supervisor, first, tmp_path / "one")
    assert run.wait(60) == 0, run.log()

    supervisor.job.env["TOY_STEPS"] = "20"
    second = supervisor.new_attempt()
    booted = time.time() - 30
    env = {
        "NOMAD_CONTAINER_STARTED_AT": str(int(booted)),
        "NOMAD_DEPS_READY_AT": str(int(booted) + 20),
    }
    run = start_agent(supervisor, second, tmp_path / "two", env=env)
    assert run.wait(60) == 0, run.log()

    phases = second.registered["phases"]
    assert phases["container_started"] - phases["deps_ready"] == pytest.approx(20, abs=0.01)
    assert phases["deps_ready"] >= 9
    beats = reported(second)
    # Each one sent until answered: here the first heartbeat that carried it was answered.
    # The job has no code, stage or setup: those boundaries still come, a moment after start.
    assert {name: len(ages) for name, ages in beats.items()} == {
        "workdir_ready": 1,
        "stage_done": 1,
        "setup_done": 1,
        "restore_downloaded": 1,
        "restore_unpacked": 1,
        "command_started": 1,
        "first_step": 1,
    }
    assert "container_started" not in beats  # delivered with register
    assert first.registered["phases"].keys() == {"deps_ready"}  # no bootstrap: the agent's start
