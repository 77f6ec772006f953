"""The CLI as a distribution of its own: it imports without Django or Celery, and
``pip install .`` from the checkout gives a working ``nomadgpu`` command with httpx and
pathspec alone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_MODULES = {
    "django", "celery", "kombu", "nomadgpu", "jobs", "hosts", "billing", "notify",
    "statuspage", "agent", "tests",
}  # fmt: skip
# What a checkout holds that a source tree handed to pip would not (and build output).
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "var", "node_modules", "__pycache__", "*.pyc", ".pytest_cache",
    ".ruff_cache", "build", "*.egg-info", ".env",
)  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    return {**env, **extra}


def run(*argv: str | Path, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def test_importing_and_running_the_cli_from_the_checkout_loads_nothing_of_the_server():
    # runpy runs the package as `python -m nomadgpu_cli --help` does, __main__ included.
    code = (
        "import runpy, sys\n"
        "sys.argv = ['nomadgpu', '--help']\n"
        "try:\n"
        "    runpy.run_module('nomadgpu_cli', run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "assert 'django' not in sys.modules and 'celery' not in sys.modules\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_MODULES!r})\n"
        "assert not loaded, loaded\n"
        "assert 'httpx' in sys.modules and 'pathspec' in sys.modules\n"
    )
    result = run(
        sys.executable, "-c", code, cwd=ROOT, env=clean_env(PYTHONPATH=str(ROOT)), timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: nomadgpu")


# What the CLI needs: httpx for the API, pathspec for the ignore files of a code pack.
CLI_DEPENDENCIES = ("httpx", "pathspec")


def cli_pins() -> list[str]:
    text = (ROOT / "requirements.txt").read_text()
    pins = [re.search(rf"^{name}==\S+", text, re.MULTILINE) for name in CLI_DEPENDENCIES]
    assert all(pins), f"requirements.txt pins {CLI_DEPENDENCIES}"
    return [pin.group(0) for pin in pins]


def test_the_distribution_pins_its_dependencies_as_requirements_txt_does():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == cli_pins()
    assert project["scripts"] == {"nomadgpu": "nomadgpu_cli.cli:main"}


@pytest.mark.slow
def test_pip_install_of_the_checkout_gives_a_nomadgpu_command_with_its_two_dependencies(tmp_path):
    """A real ``pip install`` (build isolation, dependencies from the configured index) into a
    fresh virtualenv without the project's. setuptools writes ``build/`` and ``*.egg-info`` into
    the tree it builds, so it builds a copy of the checkout, never the checkout itself."""
    source = tmp_path / "checkout"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    venv = tmp_path / "venv"
    created = run(sys.executable, "-m", "venv", venv, timeout=120, env=clean_env())
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    installed = run(
        python, "-m", "pip", "install", "--quiet", source, cwd=tmp_path, env=clean_env(),
        timeout=180,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    # Run where the checkout is not on the path: what works here works from the installed wheel.
    helped = run(venv / "bin" / "nomadgpu", "--help", cwd=tmp_path, env=clean_env(), timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: nomadgpu")
    assert "{submit,status,logs,cancel,drill}" in helped.stdout
    # The README's `python -m nomadgpu_cli`, away from the checkout: the installed package.
    as_module = run(
        python, "-m", "nomadgpu_cli", "--help", cwd=tmp_path, env=clean_env(), timeout=60
    )
    assert as_module.returncode == 0, as_module.stderr
    assert as_module.stdout == helped.stdout

    inside = (
        "import importlib.metadata as m, importlib.util, json\n"
        f"server = {sorted(SERVER_MODULES)!r}\n"
        "files = [f for f in m.files('nomadgpu-cli') if f.parts[0] != '..']\n"
        "print(json.dumps({\n"
        "    'requires': m.requires('nomadgpu-cli'),\n"
        "    'top_levels': sorted({f.parts[0] for f in files}),\n"
        "    'importable': [n for n in server if importlib.util.find_spec(n)],\n"
        "}))\n"
    )
    shown = run(python, "-I", "-c", inside, cwd=tmp_path, env=clean_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "requires": cli_pins(),
        "top_levels": ["nomadgpu_cli", "nomadgpu_cli-0.1.0.dist-info"],
        "importable": [],
    }
