"""The supervisor's processes as real subprocesses, for tests that stop, kill or cut them: the web
(``manage.py runserver``, as ``make run`` runs it, so ``nomadgpu.wsgi`` and its beacon load) and
Celery workers. They share the test's database, broker and var dir (``tests.support.processes``)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ProcessGroup, celery_command, subprocess_env, wait_until

# The kernel gives outgoing connections their source port from this range (ip_local_port_range,
# https://www.kernel.org/doc/html/latest/networking/ip-sysctl.html); 49152 is IANA's start of it.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_to_restart_on() -> int:
    """A free port below the ephemeral range, for a server stopped and started again on it.
    A port from the range (``free_port``) can be taken while the server is down by any
    outgoing connection's source port, an agent retrying its beat to that very port included
    (a self-connect), and the restart then fails: "That port is already in use"."""
    low = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 49152
    for port in random.sample(range(20000, low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between 20000 and {low}")


class WebProcess:
    """``manage.py runserver --noreload`` on a port of its own, stopped and started again on the
    same port (a deploy, a crashed server)."""

    def __init__(self, processes: ProcessGroup, env: dict[str, str]) -> None:
        self.processes, self.env = processes, env
        self.port = port_to_restart_on()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> WebProcess:
        self.starts += 1
        args = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"]
        self.proc = self.processes.start(f"web-{self.starts}", args, self.env)
        wait_until(self._answers, timeout=30, what="the web process to answer")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"the web process exited:\n{self.log()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop it as a deploy does (SIGTERM, then wait)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        self.proc = None

    def log(self) -> str:
        return "\n".join(self.processes.log(f"web-{n}") for n in range(1, self.starts + 1))


def worker_process(
    processes: ProcessGroup, env: dict[str, str], *, name: str, queues: str = "celery"
) -> subprocess.Popen:
    """A Celery worker as the Procfile starts one (prefork, its own process group)."""
    args = celery_command(
        "worker", "-Q", queues, "--pool=prefork", "--concurrency=1", "-l", "INFO", "-n", name
    )
    return processes.start(name, args, env)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process and every process it started: nothing of it gets to clean up."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=15)


def supervisor_env(settings, **overrides: str) -> dict[str, str]:
    """The environment of a supervisor subprocess: the test's database and broker, and the
    settings the test process runs its own parts with."""
    return subprocess_env(
        SITE_URL=settings.SITE_URL,
        VAST_URL=settings.VAST_URL,
        VAST_API_KEY=settings.VAST_API_KEY,
        STORAGE_BACKEND="local",
        STORAGE_LOCAL_DIR=str(settings.STORAGE_LOCAL_DIR),
        WEB_BEACON_INTERVAL_S=str(settings.WEB_BEACON_INTERVAL_S),
        PROVIDER_POLL_INTERVAL_S=str(settings.PROVIDER_POLL_INTERVAL_S),
        ORPHAN_GRACE_S=str(settings.ORPHAN_GRACE_S),
        RENT_NUDGE_AFTER_S=str(settings.RENT_NUDGE_AFTER_S),
        LOG_LEVEL="INFO",
        **overrides,
    )
