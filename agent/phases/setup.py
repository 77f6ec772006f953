"""The setup phase: the job's setup commands, run once per container before the command.

A marker in the scratch folder names the setup text, the code and the job it ran for; an agent
restarted in the same container finds it and skips setup. A setup that fails is the job's own
error (SetupFailed, exit reason ``setup_failed``), as is code that cannot be put in place.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from agent import workdir
from agent.phases.command import describe, exit_report

log = logging.getLogger("agent")


class SetupFailed(Exception):
    """The job's code or setup failed: the job's own error (exit reason ``setup_failed``)."""

    def __init__(self, error: str, returncode: int | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.returncode = returncode

    def report(self) -> dict[str, Any]:
        codes = {"exit_code": None, "signal": None}
        if self.returncode is not None:
            codes = exit_report(self.returncode, stopped=False, terminated=False)
        return {**codes, "reason": "setup_failed", "error": self.error}


def run_setup(
    setup: str, *, key: str, scratch: Path, cwd: Path, env: dict[str, str], run: workdir.Run
) -> None:
    """Run SETUP (shell text) with ``bash -e`` in CWD by RUN, unless it already ran under
    KEY (workdir.setup_key) in this container; SetupFailed when it exits non-zero."""
    if not setup.strip():
        return
    marker = scratch / workdir.SETUP_MARKER
    if workdir.marker_matches(marker, key):
        log.info("setup already ran in this container; skipping it")
        return
    script = scratch / "setup.sh"
    script.write_text(setup if setup.endswith("\n") else setup + "\n")
    shell = shutil.which("bash") or shutil.which("sh") or "/bin/sh"
    status = run("setup", [shell, "-e", str(script)], cwd, env)
    if status != 0:
        raise SetupFailed(f"setup exited with {describe(status)}", status)
    workdir.write_marker(marker, key)
    log.info("setup done")
