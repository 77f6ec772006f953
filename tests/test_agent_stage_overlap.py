"""Issue 30, measure 5: the staged model files download while the job's setup runs
(``agent.runner.Agent._prepare``), and each one's errors still end the attempt in their order.

The download and setup are stand-ins here so that the test can make each wait for the other:
the real download is in ``tests/test_staging.py`` and ``tests/e2e/test_staged_weights.py``,
the real setup in ``tests/test_agent_overlap.py``."""

from __future__ import annotations

import threading

import pytest

from agent.assignment import Assignment
from agent.phases.setup import SetupFailed
from agent.runner import Agent, Options
from agent.staging import StageEntry

WAIT_S = 10.0


def assignment(**env: str) -> Assignment:
    entry = StageEntry(kind="hf", files=(), repo="org/model", commit="0" * 40)
    return Assignment(
        job_id="j1", attempt_no=1, command="python train.py", env=dict(env),
        heartbeat_interval_s=1.0, total_steps=None, resume=None, data_key=None,
        setup="pip install -r requirements.txt", stage=(entry,),
    )  # fmt: skip


@pytest.fixture
def host(tmp_path):
    """An agent whose code, download and setup are stand-ins recording what ran when."""
    made = Agent(Options("http://127.0.0.1:9", "t", tmp_path / "work", tmp_path / "ckpt"))
    made.events = []
    made.setup_started = threading.Event()
    made._place_code = lambda a: None
    yield made
    made.storage.close()


def download_needing_setup_running(host):
    def stage(a):
        host.events.append("stage started")
        if not host.setup_started.wait(WAIT_S):
            raise AssertionError("setup never ran beside the download")
        host.events.append("stage done")

    return stage


def setup_recording(host, *, fails: bool = False):
    def setup(a):
        host.events.append("setup started")
        host.setup_started.set()
        if fails:
            raise SetupFailed("setup exited with exit code 3", 3)
        host.events.append("setup done")

    return setup


def test_the_staged_files_download_while_setup_runs(host):
    host._stage = download_needing_setup_running(host)
    host._setup = setup_recording(host)

    host._prepare(assignment())

    # Setup started before the download ended: they ran at once.
    assert host.events.index("setup started") < host.events.index("stage done")
    boundaries = host.phases.pending()
    assert {"workdir_ready", "stage_done", "setup_done"} <= set(boundaries)


def test_the_job_env_can_download_before_setup_as_before(host):
    def stage(a):
        host.events.append("stage started")
        host.events.append("stage done")

    host._stage = stage
    host._setup = setup_recording(host)

    host._prepare(assignment(NOMADGPU_STAGE_OVERLAP="0"))

    assert host.events == ["stage started", "stage done", "setup started", "setup done"]


def test_a_failing_setup_is_the_job_s_error_while_the_download_runs(host):
    host._stage = download_needing_setup_running(host)
    host._setup = setup_recording(host, fails=True)

    with pytest.raises(SetupFailed, match="exit code 3"):
        host._prepare(assignment())
    assert "setup_done" not in host.phases.pending()


def test_a_failing_download_is_raised_once_setup_is_done(host):
    def stage(a):
        host.setup_started.wait(WAIT_S)
        raise OSError("storage answered 403")

    host._stage = stage
    host._setup = setup_recording(host)

    with pytest.raises(OSError, match="403"):
        host._prepare(assignment())
    assert host.events == ["setup started", "setup done"]
    assert "stage_done" not in host.phases.pending()
