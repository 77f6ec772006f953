"""``bench/acquisition.py --quick`` runs and prints its table and its goals (issue 39 item 6).

Its shape only: a row per configuration and the bound in each weather, and a PASS or FAIL line
per goal. Whether the figures meet the goals is what the bench reports, not what this asserts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("baseline", "deadlines from bytes", "hedged rents", "team memory", "all three")


def test_the_quick_run_prints_every_configuration_the_bound_and_a_verdict_per_goal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "acquisition.py"), "--quick", "--jobs", "20"],
        capture_output=True,
        text=True,
        env={**env, "TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    weathers = re.split(r"^weather (\w+):$", out, flags=re.M)
    assert weathers[1::2] == ["typical", "bad"]
    for table in weathers[2::2]:
        names = [re.split(r"\s{2,}", line.strip())[0] for line in table.splitlines()[2:10]]
        assert names == [
            *CONFIGS,
            "memory bound (knows)",
            "memory bound (evidence)",
            "bound (knows failures)",
        ]
        for line in table.splitlines()[2:9]:  # p50, p90, p90/p50, E[wait], waste, fails/job...
            assert len(re.findall(r"-?\d+(?:\.\d+)?%?", line.split("  ", 1)[1])) == 11
    assert re.findall(r"^  seed (\d+): typical memory ", out, flags=re.M) == ["11"]
    verdicts = re.findall(r"^(PASS|FAIL) (.*)$", out, flags=re.M)
    topics = [text.split(":")[0] for _, text in verdicts]
    assert topics == [
        "bad",
        "typical",
        "typical",
        "bad",
        "double-bought offers",
        "losers alive after the winner's register",
        "typical",
        "bad",
        "rentals of a machine set aside (2 incidents in 7 days) with the memory on",
    ]


def test_the_quick_run_is_deterministic_for_a_seed(tmp_path):
    def run() -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "acquisition.py"), "--jobs", "8", "--races", "2"],
            capture_output=True,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert run() == run()
