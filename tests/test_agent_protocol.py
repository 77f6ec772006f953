"""The training-script side of the protocol: agent.report/mark_ready/checkpoint_requested and
the Hugging Face callback."""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path

import pytest

import agent


@pytest.fixture
def fresh_signal_state():
    """Each test starts with no handler installed and gets the original one back."""
    original = signal.getsignal(signal.SIGUSR1)
    agent._handler_installed = False
    agent._signals_handled = agent._signals_seen
    yield
    signal.signal(signal.SIGUSR1, original)
    agent._handler_installed = False
    agent._signals_handled = agent._signals_seen


def test_report_writes_the_progress_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "progress.json"
    monkeypatch.setenv("NOMAD_PROGRESS_FILE", str(target))

    agent.report(12, total_steps=300, loss=0.5)
    agent.report(13, loss=float("nan"))

    data = json.loads(target.read_text())
    assert data["step"] == 13
    assert data["total_steps"] is None
    assert data["loss"] is None
    assert data["time"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # no temporary left


def test_report_does_nothing_outside_the_agent(tmp_path, monkeypatch):
    monkeypatch.delenv("NOMAD_PROGRESS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    agent.report(1)
    assert list(tmp_path.iterdir()) == []


def test_mark_ready_writes_the_step_into_the_marker(tmp_path):
    agent.mark_ready(tmp_path, 120)
    assert (tmp_path / "NOMAD_READY").read_text() == "120\n"
    with pytest.raises(NotADirectoryError):
        agent.mark_ready(tmp_path / "missing", 1)


def test_checkpoint_requested_is_true_once_per_signal(fresh_signal_state):
    assert agent.checkpoint_requested() is False
    os.kill(os.getpid(), signal.SIGUSR1)
    assert agent.checkpoint_requested() is True
    assert agent.checkpoint_requested() is False


def test_checkpoint_requested_chains_an_earlier_handler(fresh_signal_state):
    seen = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    agent.checkpoint_requested()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert agent.checkpoint_requested() is True
    assert seen == [signal.SIGUSR1]


@pytest.mark.parametrize(
    ("value", "mode"),
    [("auto", "auto"), ("script", "script"), (None, "script"), ("AUTO", "script")],
)
def test_checkpoint_mode_reads_the_agents_variable_and_defaults_to_script(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("NOMAD_CHECKPOINT_MODE", raising=False)
    else:
        monkeypatch.setenv("NOMAD_CHECKPOINT_MODE", value)

    assert agent.checkpoint_mode() == mode


def test_the_hf_module_imports_without_transformers_and_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    monkeypatch.delitem(sys.modules, "agent.hf", raising=False)
    import agent.hf

    with pytest.raises(ImportError, match="needs the `transformers` package"):
        agent.hf.NomadCallback  # noqa: B018


@pytest.fixture
def hf_with_fake_transformers(monkeypatch):
    fake = types.ModuleType("transformers")
    fake.TrainerCallback = type("TrainerCallback", (), {})
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.delitem(sys.modules, "agent.hf", raising=False)
    import agent.hf

    yield agent.hf
    sys.modules.pop("agent.hf", None)


def test_the_hf_callback_reports_saves_on_request_and_marks_ready(
    hf_with_fake_transformers, fresh_signal_state, tmp_path, monkeypatch
):
    monkeypatch.setenv("NOMAD_PROGRESS_FILE", str(tmp_path / "progress.json"))
    callback = hf_with_fake_transformers.NomadCallback()
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    state = types.SimpleNamespace(global_step=50, max_steps=300)
    control = types.SimpleNamespace(should_save=False)

    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs={"loss": 0.8})
    assert json.loads((tmp_path / "progress.json").read_text())["loss"] == 0.8

    callback.on_step_end(args, state, control)
    assert control.should_save is False
    os.kill(os.getpid(), signal.SIGUSR1)
    callback.on_step_end(args, state, control)
    assert control.should_save is True

    Path(tmp_path / "checkpoint-50").mkdir()
    callback.on_save(args, state, control)
    assert (tmp_path / "checkpoint-50" / "NOMAD_READY").read_text() == "50\n"
