"""The agent as one file, and its independence from the rest of the project."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from agent.build import build_zipapp

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = {"django", "nomadgpu", "jobs", "hosts", "billing", "statuspage", "tests"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    return {**env, **extra}


def test_the_zipapp_is_reproducible_and_runs(tmp_path):
    first = build_zipapp(tmp_path / "a" / "agent.pyz")
    second = build_zipapp(tmp_path / "b" / "agent.pyz")
    assert (
        hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    )
    names = zipfile.ZipFile(first).namelist()
    assert names[0] == "__main__.py"
    assert "agent/runner.py" in names
    assert "agent/ckptcrypto.py" in names

    result = subprocess.run(
        [sys.executable, str(first), "--version"], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    assert "nomadgpu-agent 0.1.0" in result.stdout

    result = subprocess.run(
        [sys.executable, str(first)], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "NOMAD_SUPERVISOR_URL" in result.stderr


def test_importing_the_agent_pulls_in_nothing_of_the_project():
    code = (
        "import sys, agent\n"
        "assert 'httpx' not in sys.modules, 'agent/__init__ must stay light'\n"
        "import agent.runner, agent.hf, agent.ckptcrypto, agent.build, agent.__main__\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {PROJECT_PACKAGES!r})\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_no_agent_source_imports_the_project():
    for path in (ROOT / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & PROJECT_PACKAGES, f"{path.name} imports {roots & PROJECT_PACKAGES}"
