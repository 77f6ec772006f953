"""The agent reports its early phases' bytes on its heartbeats (PROTOCOL.md, heartbeat
``phase_progress``): the real agent as a subprocess against the live fake supervisor, which
validates them, and a real S3 protocol server; then the meter's own counting, in process."""

from __future__ import annotations

import pytest

from agent import checkpoints as ck
from agent.phases.meter import PhaseMeter
from tests.support.agent_fake_supervisor import (
    FakeJob,
    FakeSupervisor,
    code_pack,
    start_agent,
    toy_command,
)

FAST = {"TOY_STEP_SECONDS": "0.05", "TOY_STEPS": "10", "TOY_CHECKPOINT_EVERY": "10"}
# Setup waits for the restore beside it to finish, then a few heartbeats more, so that beats
# carrying every early phase ended are sent before the command starts.
SETUP_OUTLASTS_THE_RESTORE = """\
for i in $(seq 1 400); do
  if [ -d "$NOMAD_CHECKPOINT_DIR/resume-10" ]; then sleep 1; exit 0; fi
  sleep 0.05
done
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


def test_each_early_phase_reports_its_bytes_until_the_command_starts(supervisor, runs, tmp_path):
    first = supervisor.new_attempt()
    runs.append(start_agent(supervisor, first, tmp_path / "one"))
    assert runs[-1].wait(60) == 0, runs[-1].log()
    [checkpoint] = supervisor.ready_checkpoints(first)
    supervisor.store_code_pack(code_pack({"train.py": "print('hi')\n"}))
    supervisor.job.setup = SETUP_OUTLASTS_THE_RESTORE
    supervisor.job.env["TOY_STEPS"] = "20"

    second = supervisor.new_attempt()
    runs.append(start_agent(supervisor, second, tmp_path / "two"))
    assert runs[-1].wait(60) == 0, runs[-1].log()

    early = [b for b in second.heartbeats if b["phase"] == "restoring"]
    reported = [b["phase_progress"] for b in early if "phase_progress" in b]
    last = reported[-1]
    pack_size = supervisor.job.workdir["size"]
    assert last["code"] == {"bytes_done": pack_size, "bytes_total": pack_size, "done": True}
    assert last["restore"] == {
        "bytes_done": checkpoint.size,
        "bytes_total": checkpoint.size,
        "done": True,
    }
    assert last["setup"]["bytes_total"] is None  # pip, git: no total is known
    # Each phase's bytes only grow, and never pass what it downloads here (no retry).
    for name, total in (("code", pack_size), ("restore", checkpoint.size)):
        seen = [p[name]["bytes_done"] for p in reported if name in p]
        assert seen == sorted(seen)
        assert seen[-1] <= total
    # Once the command runs, no beat carries them.
    running = [b for b in second.heartbeats if b["phase"] != "restoring"]
    assert running
    assert not any("phase_progress" in b for b in running)


def test_a_first_attempt_without_code_or_restore_reports_nothing_to_judge(
    supervisor, runs, tmp_path
):
    attempt = supervisor.new_attempt()
    runs.append(start_agent(supervisor, attempt, tmp_path / "one"))

    assert runs[-1].wait(60) == 0, runs[-1].log()
    for beat in attempt.heartbeats:
        assert set(beat.get("phase_progress") or {}) <= {"setup"}


def test_the_meter_counts_each_phase_and_the_agents_total():
    received = [1000]
    meter = PhaseMeter(lambda: received[0])
    total = ck.ByteCounter()

    restore = meter.counter("restore", total)
    meter.begin("restore", 300)
    restore.add(down=120)
    meter.begin_by_network("setup")
    received[0] += 4096
    snapshot = meter.snapshot()
    restore.add(down=180)
    meter.end("restore")

    assert snapshot == {
        "restore": {"bytes_done": 120, "bytes_total": 300, "done": False},
        "setup": {"bytes_done": 4096, "bytes_total": None, "done": False},
    }
    assert meter.snapshot()["restore"] == {"bytes_done": 300, "bytes_total": 300, "done": True}
    assert (total.down, restore.down) == (300, 300)


def test_without_readable_counters_a_network_phase_reports_no_bytes():
    meter = PhaseMeter(lambda: None)
    meter.begin_by_network("setup")

    assert meter.snapshot() == {"setup": {"bytes_done": 0, "bytes_total": None, "done": False}}
