"""Hugging Face Trainer support: ``NomadCallback`` follows the checkpoint protocol for you.

    import os
    from transformers import Trainer, TrainingArguments
    from agent.hf import NomadCallback

    args = TrainingArguments(output_dir=os.environ["NOMAD_CHECKPOINT_DIR"], save_steps=50, ...)
    trainer = Trainer(model=model, args=args, ..., callbacks=[NomadCallback()])
    trainer.train(resume_from_checkpoint=os.environ.get("NOMAD_RESUME_FROM"))

It reports progress and loss, saves when the supervisor asks for a checkpoint, and marks each
``checkpoint-<step>`` directory ready after the Trainer wrote it. ``output_dir`` must be
``$NOMAD_CHECKPOINT_DIR``: the agent watches that directory. Avoid a small ``save_total_limit``
(the Trainer deletes old checkpoints, possibly while the agent is still uploading them).

Who decides when to save follows the job's ``checkpoint`` setting (``agent.checkpoint_mode()``):
with ``"script"`` (the default) the Trainer keeps its own ``save_steps`` / epoch schedule and
requests add saves to it; with ``"auto"`` the Trainer saves only when the supervisor asks and
at the end of training, and its ``save_steps`` / epoch saves are dropped. This relies on the
Trainer calling its ``DefaultFlowCallback`` (which sets ``should_save`` on that schedule) before
the callbacks it is given, as ``Trainer`` does (``DEFAULT_CALLBACKS + callbacks``).

Several processes (``torchrun`` / ``accelerate launch``, DDP or FSDP): rank 0 alone reports
progress and loss and marks checkpoints ready. A checkpoint request reaches every rank (SIGUSR1
to the process group), but at whichever step each happens to be in, and a save that only some
ranks start deadlocks (FSDP's is collective). So at every step end rank 0's answer is broadcast
(``torch.distributed``) and all ranks save at the same step, or none. After a save every rank
waits at a barrier (each writes its own RNG state, and shards under FSDP) before rank 0 writes
``NOMAD_READY``: the agent uploads only a checkpoint that all ranks finished.

This module imports without transformers installed; only using ``NomadCallback`` needs it.
"""

from __future__ import annotations

import os
from typing import Any

from agent import AUTO, checkpoint_mode, checkpoint_requested, mark_ready, report


def _build_callback_class() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError(
            "agent.hf.NomadCallback needs the `transformers` package "
            "(pip install transformers) in the training environment"
        ) from exc

    class NomadCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        """Progress, checkpoint-on-request and ready markers for the NomadGPU agent."""

        def __init__(self) -> None:
            self._loss: float | None = None
            self._auto = checkpoint_mode() == AUTO

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            checkpoint_requested()  # installs the SIGUSR1 handler before the first step

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self._loss = logs["loss"]
            if _is_rank_zero(state):
                report(state.global_step, state.max_steps or None, self._loss)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if _is_rank_zero(state):
                report(state.global_step, state.max_steps or None, self._loss)
            requested = _agreed(checkpoint_requested(), args)
            if self._auto:
                # DefaultFlowCallback ran before us and set should_save at save_steps: in auto
                # mode the supervisor's interval replaces that schedule, so only a request or
                # the end of training saves.
                control.should_save = requested or _final_save(control)
            elif requested:
                control.should_save = True
            return control

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self._auto:  # save_strategy="epoch": the same schedule, set per epoch
                control.should_save = _final_save(control)
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _all_ranks_saved()
            if not _is_rank_zero(state):
                return
            path = checkpoint_path(args.output_dir, state.global_step)
            if os.path.isdir(path):
                mark_ready(path, state.global_step)

    return NomadCallback


def _is_rank_zero(state: Any) -> bool:
    # The Trainer's TrainerState says; a state without the field is one process's.
    return bool(getattr(state, "is_world_process_zero", True))


def _distributed() -> Any:
    """``torch.distributed`` when this process is one of several ranks, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # no torch, so no ranks: a Trainer stand-in, one process
        return None

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _agreed(requested: bool, args: Any) -> bool:
    """Rank 0's REQUESTED, the same on every rank: the request reaches the ranks at different
    steps, and they must all save at the same one. One process: REQUESTED itself."""
    dist = _distributed()
    if dist is None:
        return requested
    import torch

    # On the ranks' own device: NCCL broadcasts GPU tensors only (gloo takes the CPU's).
    flag = torch.tensor([1 if requested else 0], dtype=torch.int32, device=args.device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _all_ranks_saved() -> None:
    # The Trainer's save has no barrier of its own at the end: each rank writes its RNG state
    # (and its shards under FSDP) after rank 0 wrote the model, so rank 0 must not mark the
    # checkpoint ready before every rank is here.
    dist = _distributed()
    if dist is not None:
        dist.barrier()


def _final_save(control: Any) -> bool:
    # The Trainer's save as training ends stays in auto mode: that checkpoint is the job's result.
    return bool(control.should_save and control.should_training_stop)


def checkpoint_path(output_dir: str, step: int) -> str:
    """Where the Trainer puts the checkpoint of STEP (its ``checkpoint-<step>`` naming)."""
    return os.path.join(output_dir, f"checkpoint-{step}")


def __getattr__(name: str) -> Any:
    # Building the class imports transformers, so it happens on first use, not on import.
    if name == "NomadCallback":
        cls = _build_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
