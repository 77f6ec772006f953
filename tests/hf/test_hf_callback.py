"""``agent.hf.NomadCallback`` drives the checkpoint protocol from the Hugging Face ``Trainer``.

In-process: a checkpoint request (SIGUSR1) becomes ``control.should_save`` and a ready
``checkpoint-<step>``. Under the real agent (a subprocess) against the fake supervisor and moto
S3: ``examples/qlora/train.py --tiny`` (a tiny random Qwen2 with LoRA on the CPU, nothing
downloaded) saves, marks ready and uploads its checkpoints, and a second attempt restores the
newest one and the Trainer carries on from its step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import sys
import tomllib
from types import ModuleType

import pytest
import torch
from django.utils import timezone
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import agent
from agent.hf import NomadCallback
from hosts import selection
from jobs.lifecycle import submit_job
from jobs.renting import terms
from tests.support.agent_fake_supervisor import FakeJob, FakeSupervisor, start_agent
from tests.support.agent_runs import steps_seen, tar_members
from tests.support.market import load_market
from tests.support.qlora import OFFLINE, QLORA, TINY_FLAGS, TRAIN

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"  # raised inside peft
)


def load_train_module() -> ModuleType:
    """examples/qlora/train.py as a module (it is a script, not part of a package)."""
    name = "examples_qlora_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TRAIN)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def usr1(monkeypatch):
    """The callback installs a process-wide SIGUSR1 handler: give it a clean slate, then undo it."""
    previous = signal.getsignal(signal.SIGUSR1)
    monkeypatch.setattr(agent, "_handler_installed", False)
    monkeypatch.setattr(agent, "_signals_seen", 0)
    monkeypatch.setattr(agent, "_signals_handled", 0)
    yield lambda: os.kill(os.getpid(), signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, previous)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_checkpoint_request_sets_should_save_once_and_on_save_marks_ready(
    usr1, monkeypatch, tmp_path
):
    progress = tmp_path / "progress.json"
    monkeypatch.setenv("NOMAD_PROGRESS_FILE", str(progress))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    state = TrainerState(global_step=7, max_steps=20)
    callback = NomadCallback()
    callback.on_train_begin(args, state, TrainerControl())  # installs the SIGUSR1 handler

    assert callback.on_step_end(args, state, TrainerControl()).should_save is False
    usr1()
    usr1()  # two requests before the next step count as one
    assert callback.on_step_end(args, state, TrainerControl()).should_save is True
    assert callback.on_step_end(args, state, TrainerControl()).should_save is False

    callback.on_log(args, state, TrainerControl(), logs={"loss": 1.25, "learning_rate": 1e-4})
    reported = json.loads(progress.read_text())
    assert (reported["step"], reported["total_steps"], reported["loss"]) == (7, 20, 1.25)

    folder = tmp_path / "out" / "checkpoint-7"
    folder.mkdir(parents=True)
    callback.on_save(args, state, TrainerControl())
    assert (folder / agent.READY_MARKER).read_text() == "7\n"
    state.global_step = 8  # a save whose folder the Trainer did not write: nothing to mark
    callback.on_save(args, state, TrainerControl())
    assert not (tmp_path / "out" / "checkpoint-8").exists()


class RequestCheckpointDuring(TrainerCallback):
    """Plays the agent's checkpoint_now: a SIGUSR1 while step STEP runs."""

    def __init__(self, step: int, send) -> None:
        self.step, self.send = step, send

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.send()


def test_the_trainer_saves_a_requested_checkpoint_between_save_steps(
    usr1, one_thread, monkeypatch, tmp_path
):
    monkeypatch.setenv("NOMAD_PROGRESS_FILE", str(tmp_path / "progress.json"))
    out = tmp_path / "out"
    train_tiny(
        out,
        max_steps=5,
        save_steps=100,
        callbacks=[RequestCheckpointDuring(2, usr1), NomadCallback()],
    )

    # Step 2 on request, step 5 because training ended; nothing else (save_steps is 100).
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-5"]
    for step in (2, 5):
        folder = out / f"checkpoint-{step}"
        assert (folder / agent.READY_MARKER).read_text() == f"{step}\n"
        assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step
        assert (folder / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 5


def train_tiny(out, *, max_steps: int, save_steps: int, callbacks: list) -> None:
    qlora = load_train_module()
    options = qlora.parse_args([*TINY_FLAGS, "--steps", str(max_steps)])
    model, data, enc = qlora.tiny_model_and_data(options)
    args = TrainingArguments(
        output_dir=str(out), max_steps=max_steps, save_steps=save_steps,
        per_device_train_batch_size=2, logging_steps=1, use_cpu=True, report_to="none",
        disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=qlora.PadCollator(enc.pad_id),
        callbacks=callbacks,
    )
    trainer.train()


@pytest.mark.parametrize(
    ("mode", "saved"),
    [
        # The supervisor's interval replaces save_steps: the request and the end only.
        ("auto", [3, 6]),
        # The Trainer's own schedule, the request on top of it.
        ("script", [2, 3, 4, 6]),
    ],
)
def test_in_auto_mode_the_trainer_saves_only_when_asked_and_at_the_end(
    usr1, one_thread, monkeypatch, tmp_path, mode, saved
):
    monkeypatch.setenv("NOMAD_PROGRESS_FILE", str(tmp_path / "progress.json"))
    monkeypatch.setenv("NOMAD_CHECKPOINT_MODE", mode)
    out = tmp_path / "out"

    train_tiny(
        out,
        max_steps=6,
        save_steps=2,
        callbacks=[RequestCheckpointDuring(3, usr1), NomadCallback()],
    )

    assert sorted(p.name for p in out.iterdir()) == [f"checkpoint-{step}" for step in saved]
    for step in saved:
        assert (out / f"checkpoint-{step}" / agent.READY_MARKER).read_text() == f"{step}\n"


def test_in_auto_mode_the_trainers_epoch_saves_are_dropped_but_the_last_one_stays(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("NOMAD_CHECKPOINT_MODE", "auto")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    callback = NomadCallback()
    state = TrainerState(global_step=10, max_steps=20)

    mid = callback.on_epoch_end(args, state, TrainerControl(should_save=True))
    last = TrainerControl(should_save=True, should_training_stop=True)

    assert mid.should_save is False
    assert callback.on_epoch_end(args, state, last).should_save is True


def test_the_chat_template_path_learns_only_the_assistant_turn():
    """The GPU path's data handling, on train.py's in-memory byte-level tokenizer with a
    Qwen-style chat template (the real tokenizer would be a download)."""
    qlora = load_train_module()
    tokenizer = qlora.tiny_tokenizer()
    enc = qlora.chat_encoder(tokenizer)
    row = {"instruction": "Add the numbers.", "input": "3+5", "output": "8"}

    example = qlora.encode_row(row, enc, max_length=512)

    ids, labels = example["input_ids"], example["labels"]
    learnt = [i for i, label in zip(ids, labels, strict=True) if label != qlora.IGNORE]
    prompt = tokenizer.decode(ids[: len(ids) - len(learnt)])
    user_turn = "<|im_start|>user\nAdd the numbers.\n\n3+5<|im_end|>\n"
    assert prompt.endswith(user_turn + "<|im_start|>assistant\n")
    assert tokenizer.decode(learnt) == "8<|im_end|>\n"
    assert enc.pad_id == tokenizer.pad_token_id
    # A row whose prompt fills max_length teaches nothing: the data set serves the next row.
    long_row = {**row, "input": "9" * 400}
    assert qlora.encode_row(long_row, enc, max_length=300) is None
    data = qlora.InstructionData([long_row, row], enc, max_length=300)
    assert data[0] == data[1] == qlora.encode_row(row, enc, max_length=300)


def test_the_sft_path_learns_only_the_assistant_turn_too(one_thread, tmp_path):
    """--trainer sft: TRL renders the prompt-completion rows with the chat template and masks
    the prompt, so both trainers learn the same thing from a row."""
    qlora = load_train_module()
    options = qlora.parse_args(
        [*TINY_FLAGS, "--trainer", "sft", "--steps", "1", "--output-dir", str(tmp_path)]
    )
    trainer = qlora.sft_trainer(options, callbacks=[])

    example, row = trainer.train_dataset[0], qlora.synthetic_rows(qlora.TINY_ROWS, options.seed)[0]
    ids, labels = example["input_ids"], example["labels"]
    learnt = [i for i, label in zip(ids, labels, strict=True) if label != qlora.IGNORE]
    decode = trainer.processing_class.decode
    assert decode(ids).endswith(f"user\nAdd the numbers.\n\n{row['input']}<|im_end|>\n"
                                f"<|im_start|>assistant\n{row['output']}<|im_end|>\n")  # fmt: skip
    assert decode(learnt) == f"{row['output']}<|im_end|>\n"


def test_trainer_checkpoints_are_uploaded_and_the_next_attempt_resumes_from_the_newest(
    s3, tmp_path
):
    command = shlex.join([sys.executable, str(TRAIN), *TINY_FLAGS])
    job = FakeJob(command=command, env=dict(OFFLINE), total_steps=12)
    supervisor = FakeSupervisor(s3, job)
    runs = []
    try:
        first = supervisor.new_attempt()
        runs.append(start_agent(supervisor, first, tmp_path / "one"))
        assert runs[-1].wait(120) == 0, runs[-1].log()

        assert first.exit["reason"] == "finished"
        assert "finished at step 12" in first.exit["log_tail"]
        steps = steps_seen(first)
        assert steps == sorted(steps)
        assert steps[-1] == 12
        last = first.heartbeats[-1]
        assert last["total_steps"] == 12
        assert isinstance(last["loss"], float)
        ready = supervisor.ready_checkpoints(first)
        # 12 always arrives; 4 and 8 only if shipped before a newer one superseded them.
        steps = [c.step for c in ready]
        assert steps[-1] == 12
        assert set(steps) <= {4, 8, 12}
        for ckpt in ready:
            files = tar_members(s3.get(ckpt.key))
            assert json.loads(files["trainer_state.json"])["global_step"] == ckpt.step
            assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt"} <= set(files)
            assert agent.READY_MARKER not in files
        local = tmp_path / "one" / "checkpoints"
        assert len(list(local.glob("checkpoint-*/NOMAD_UPLOADED"))) == len(steps)

        # The host is gone; the job was extended to 16 steps. The next attempt restores
        # checkpoint 12 and the Trainer goes on from there, not from 0.
        supervisor.job.total_steps = 16
        second = supervisor.new_attempt()
        runs.append(start_agent(supervisor, second, tmp_path / "two"))
        assert runs[-1].wait(120) == 0, runs[-1].log()

        assert second.exit["reason"] == "finished"
        tail = second.exit["log_tail"]
        assert "at step 12" in tail
        assert "resume-12" in tail
        assert "finished at step 16" in tail
        assert min(steps_seen(second)) >= 13
        assert max(steps_seen(second)) == 16
        assert max(h["bytes_down"] for h in second.heartbeats) == ready[-1].size
        (newest,) = supervisor.ready_checkpoints(second)
        assert newest.step == 16
        state = json.loads(tar_members(s3.get(newest.key))["trainer_state.json"])
        assert state["global_step"] == 16
        # One history from step 1 to 16: the first attempt's part came with the checkpoint.
        logged = [entry["step"] for entry in state["log_history"] if "loss" in entry]
        assert logged == list(range(1, 17))
    finally:
        for run in runs:
            run.stop()
        supervisor.close()


def test_train_script_refuses_a_folder_that_is_not_a_trainer_checkpoint(tmp_path):
    qlora = load_train_module()
    with pytest.raises(SystemExit, match="not a Trainer checkpoint"):
        qlora.checkpoint_step(str(tmp_path))


def test_without_tiny_and_without_a_gpu_it_says_so_before_downloading_anything(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    qlora = load_train_module()
    with pytest.raises(SystemExit, match="no CUDA GPU visible"):
        qlora.main(["--steps", "1", "--output-dir", str(tmp_path)])


def test_the_job_file_is_a_job_that_rents_like_the_field_report(cast):
    fields = tomllib.loads((QLORA / "job.toml").read_text())
    assert fields.pop("workdir") == "."  # the CLI packs the folder; the job stores its pack
    job = submit_job(team=cast.team_a, created_by=cast.member, now=timezone.now(), **fields)

    job.refresh_from_db()
    assert job.image == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"  # public, nothing baked
    assert (job.setup, job.command) == ("pip install -r requirements.txt", "python train.py")
    assert (job.total_steps, job.env["QLORA_SAVE_STEPS"]) == (300, "50")
    offers, _ = load_market()
    decision = selection.choose_offer(
        offers,
        terms.requirements_for(job),
        terms.profile_for(job),
        selection.SpeedBook(),
    )
    assert decision.chosen is not None
    assert decision.chosen.offer.gpu_name == "RTX 4090"
    assert decision.chosen.offer.reliability >= 0.98
    # The field report: 0.44 h on the machine, about $0.19.
    assert 0.3 < decision.chosen.cost.gpu_billed_h < 0.6
    assert 0.1 < decision.chosen.cost.total_usd < 0.3
