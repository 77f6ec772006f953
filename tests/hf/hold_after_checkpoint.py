"""``examples/qlora/train.py`` that stops moving once checkpoint STEP is saved and marked ready.

    python hold_after_checkpoint.py STEP [train.py's flags...]

The training command of a host that is about to be lost: the test waits until the agent has
uploaded checkpoint STEP, then kills the agent and this process (SIGKILL, no goodbye), so the
replacement resumes from exactly STEP and never from a later checkpoint that slipped out first.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "qlora" / "train.py"


def load_train() -> Any:
    """train.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("qlora_train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def hold_after(step: int) -> Any:
    """A callback that blocks forever in ``on_save`` of STEP. It runs after NomadCallback's
    ``on_save``, so the checkpoint is already written and marked ready."""
    from transformers import TrainerCallback

    class Hold(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step:
                print(f"holding after checkpoint {step}", flush=True)
                threading.Event().wait()  # for good: nothing ever sets it

    return Hold()


if __name__ == "__main__":
    sys.exit(load_train().main(sys.argv[2:], extra_callbacks=[hold_after(int(sys.argv[1]))]))
