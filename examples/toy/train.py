"""A deterministic toy trainer on the CPU that follows the NomadGPU checkpoint protocol.

It moves a weight vector towards a target by noisy gradient steps whose noise comes from a seed
per step, so a run interrupted at any step and resumed from a checkpoint ends with exactly the
same weights as an uninterrupted run: its last line, ``final-digest: <sha256 of the weights>``,
proves it.

Standard library only; a run takes seconds. Settings (environment):
  TOY_STEPS (default $NOMAD_TOTAL_STEPS or 300), TOY_CHECKPOINT_EVERY (50),
  TOY_STEP_SECONDS (0.02, the time one step takes), TOY_WEIGHTS_KB (8, size of the weights),
  TOY_SEED (1234), SANDBOX_SLOW_FILE: a file holding a slowdown factor (the sandbox's "slow
  host"), reread every step.
Checkpoints are folders ``checkpoint-<step>`` directly under $NOMAD_CHECKPOINT_DIR (like Hugging
Face's), marked ready with ``agent.mark_ready``. Resumes from $NOMAD_RESUME_FROM. On SIGTERM it
saves a checkpoint and exits with 143; on SIGUSR1 (the agent's checkpoint_now) it saves one.
With $NOMAD_CHECKPOINT_MODE=auto (the job's ``checkpoint = "auto"``) TOY_CHECKPOINT_EVERY is
ignored: it saves only when asked, when stopped and at the last step.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import struct
import sys
import time
from pathlib import Path

from agent import AUTO, checkpoint_mode, checkpoint_requested, mark_ready, report

STATE_FILE = "state.json"
WEIGHTS_FILE = "weights.bin"
LEARNING_RATE = 0.02
NOISE = 0.001


def env_number(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def slowdown() -> float:
    # The sandbox's "slow host" fault writes a factor here; it may appear at any time.
    path = os.environ.get("SANDBOX_SLOW_FILE")
    if not path:
        return 1.0
    try:
        return max(0.0, float(Path(path).read_text().strip()))
    except (OSError, ValueError):
        return 1.0


def initial_weights(size: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(-1, 1) for _ in range(size)]


def target_weights(size: int, seed: int) -> list[float]:
    rng = random.Random(seed + 1)
    return [rng.uniform(-1, 1) for _ in range(size)]


def sgd_step(weights: list[float], target: list[float], step: int, seed: int) -> float:
    """One noisy gradient step towards the target, the noise drawn from (seed, step) alone: the
    run is a pure function of the step numbers, whichever host runs which step."""
    rng = random.Random(seed * 1_000_003 + step)
    for i, (w, t) in enumerate(zip(weights, target, strict=True)):
        weights[i] = w - LEARNING_RATE * 2 * (w - t) + rng.gauss(0, NOISE)
    return sum((w - t) ** 2 for w, t in zip(weights, target, strict=True)) / len(weights)


def pack(weights: list[float]) -> bytes:
    return struct.pack(f"<{len(weights)}d", *weights)


def unpack(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 8}d", data))


def resume(size: int, seed: int) -> tuple[int, list[float]]:
    path = os.environ.get("NOMAD_RESUME_FROM")
    if not path:
        return 0, initial_weights(size, seed)
    state = json.loads((Path(path) / STATE_FILE).read_text())
    weights = unpack((Path(path) / WEIGHTS_FILE).read_bytes())
    if len(weights) != size:
        sys.exit(f"checkpoint {path} holds {len(weights)} weights, expected {size}")
    print(f"resumed from step {state['step']} ({path})", flush=True)
    return int(state["step"]), weights


def save(root: Path, step: int, loss: float, weights: list[float]) -> None:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    (path / WEIGHTS_FILE).write_bytes(pack(weights))
    (path / STATE_FILE).write_text(json.dumps({"step": step, "loss": loss}))
    mark_ready(path, step)  # last: from here on the folder belongs to the agent
    print(f"checkpoint saved at step {step}", flush=True)


def main() -> int:
    steps = int(env_number("TOY_STEPS", env_number("NOMAD_TOTAL_STEPS", 300)))
    every = int(env_number("TOY_CHECKPOINT_EVERY", 50))
    own_schedule = checkpoint_mode() != AUTO  # auto: the supervisor's requests replace it
    step_seconds = env_number("TOY_STEP_SECONDS", 0.02)
    size = max(1, int(env_number("TOY_WEIGHTS_KB", 8) * 1024 // 8))
    seed = int(env_number("TOY_SEED", 1234))
    root = Path(os.environ.get("NOMAD_CHECKPOINT_DIR") or "toy-checkpoints")
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    checkpoint_requested()  # listen for checkpoint requests before the first step
    start, weights = resume(size, seed)
    target = target_weights(size, seed)
    for step in range(start + 1, steps + 1):
        time.sleep(step_seconds * slowdown())
        loss = sgd_step(weights, target, step, seed)
        report(step, total_steps=steps, loss=loss)
        print(f"step {step}/{steps} loss {loss:.6f}", flush=True)
        due = own_schedule and step % every == 0
        if due or step == steps or checkpoint_requested() or stopping:
            save(root, step, loss, weights)
        if stopping:
            print(f"stopped at step {step}", flush=True)
            return 143
    print("done", flush=True)
    print(f"final-digest: {hashlib.sha256(pack(weights)).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
