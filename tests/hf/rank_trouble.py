"""``examples/qlora/train.py`` in which rank 1 crashes or hangs at step STEP.

    python rank_trouble.py crash|hang STEP [train.py's flags...]

A rank's own trouble in a multi-process job (``launcher = "torchrun"``): ``crash`` raises in
rank 1 (the job's error: its traceback must reach the log tail); ``hang`` blocks rank 1 for
good, so the other ranks wait in the next collective and no step is reported again (a stall).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from hold_after_checkpoint import load_train


def trouble(mode: str, step: int) -> Any:
    from transformers import TrainerCallback

    class Trouble(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if os.environ.get("RANK") != "1" or state.global_step != step:
                return
            if mode == "crash":
                raise RuntimeError(f"rank 1 fails at step {step} on purpose")
            print(f"rank 1 hangs at step {step}", flush=True)
            threading.Event().wait()  # for good: nothing ever sets it

    return Trouble()


if __name__ == "__main__":
    mode, step = sys.argv[1], int(sys.argv[2])
    sys.exit(load_train().main(sys.argv[3:], extra_callbacks=[trouble(mode, step)]))
