"""Running the ``nomadgpu`` CLI as a subprocess and reading its output while it runs."""

from __future__ import annotations

import subprocess
import sys
import threading

from tests.support.processes import ROOT, wait_until


class Follower:
    """``python -m nomadgpu_cli ...`` in a subprocess, its output collected line by line."""

    def __init__(self, url: str, token: str, *argv: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nomadgpu_cli", "--url", url, "--poll", "0.1", *argv],
            cwd=ROOT,
            env={"NOMADGPU_TOKEN": token, "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 30) -> None:
        wait_until(
            lambda: any(text in line for line in self.lines),
            timeout=timeout,
            what=f"the CLI to print {text!r}; it printed {self.lines}",
        )

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)
