"""The toy trainer is deterministic across interruptions: resumed runs end with the same digest."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT

FAST = {"TOY_STEP_SECONDS": "0", "TOY_STEPS": "120", "TOY_CHECKPOINT_EVERY": "50"}


def run_toy(tmp_path, **env) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples/toy/train.py")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **FAST, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def digest(stdout: str) -> str:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("final-digest: ")
    return last.removeprefix("final-digest: ")


def test_a_resumed_run_ends_with_the_same_digest_as_an_uninterrupted_one(tmp_path):
    whole = run_toy(tmp_path, NOMAD_CHECKPOINT_DIR=str(tmp_path / "a"))
    first_part = run_toy(tmp_path, NOMAD_CHECKPOINT_DIR=str(tmp_path / "b"), TOY_STEPS="50")
    assert "checkpoint saved at step 50" in first_part
    resumed = run_toy(
        tmp_path,
        NOMAD_CHECKPOINT_DIR=str(tmp_path / "c"),
        NOMAD_RESUME_FROM=str(tmp_path / "b" / "checkpoint-50"),
    )

    assert "resumed from step 50" in resumed
    assert digest(resumed) == digest(whole)
    assert (tmp_path / "a" / "checkpoint-100" / "NOMAD_READY").exists()


def test_different_seeds_give_different_digests(tmp_path):
    one = digest(run_toy(tmp_path, NOMAD_CHECKPOINT_DIR=str(tmp_path / "a")))
    two = digest(run_toy(tmp_path, NOMAD_CHECKPOINT_DIR=str(tmp_path / "b"), TOY_SEED="7"))

    assert one != two


def test_in_auto_mode_it_keeps_no_schedule_of_its_own_and_saves_at_its_last_step(tmp_path):
    out = run_toy(tmp_path, NOMAD_CHECKPOINT_DIR=str(tmp_path / "a"), NOMAD_CHECKPOINT_MODE="auto")

    assert "checkpoint saved at step 50" not in out
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["checkpoint-120"]
