"""The toy trainer (``examples/toy/train.py``) as the tests run it: its command and the field
report's run, shorter runs, the final digest of an uninterrupted run (the reference a recovered
run must equal) and the digest a job's last attempt printed."""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile

from tests.support.processes import ROOT

TOY = f"{sys.executable} {ROOT}/examples/toy/train.py"
TOY_ENV = {"TOY_STEPS": "300", "TOY_CHECKPOINT_EVERY": "50", "TOY_STEP_SECONDS": "0.08"}
FAST = {"TOY_STEP_SECONDS": "0.05"}  # the agent's own tests: a step every 50 ms


@functools.cache
def _toy_digest(items: frozenset) -> str:
    with tempfile.TemporaryDirectory(prefix="toy-reference-") as out:
        result = subprocess.run(
            [sys.executable, str(ROOT / "examples/toy/train.py")],
            env={
                "PYTHONPATH": str(ROOT),
                **dict(items),
                "TOY_STEP_SECONDS": "0",
                "NOMAD_CHECKPOINT_DIR": out,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    return result.stdout.strip().splitlines()[-1].removeprefix("final-digest: ")


def toy_digest(env: dict[str, str]) -> str:
    """The final digest of an uninterrupted toy run with ENV (computed once per env)."""
    return _toy_digest(frozenset(env.items()))


def toy_env(steps: int, every: int, step_seconds: float) -> dict[str, str]:
    """A shorter toy run than the field report's, for scenarios that only need some steps."""
    return {
        "TOY_STEPS": str(steps),
        "TOY_CHECKPOINT_EVERY": str(every),
        "TOY_STEP_SECONDS": str(step_seconds),
    }


def submit(supervisor, env: dict[str, str], **overrides):
    return supervisor.submit_toy(env=env, total_steps=int(env["TOY_STEPS"]), **overrides)


def final_digest_of(job) -> str:
    last = job.attempts.order_by("-number").first()
    lines = [line for line in last.log_tail.splitlines() if line.startswith("final-digest: ")]
    assert lines, f"no final digest in the last attempt's log:\n{last.log_tail[-1000:]}"
    return lines[-1].removeprefix("final-digest: ")
