"""GPU health from nvidia-smi, polled in a thread so a hung driver never delays a heartbeat."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from typing import Any

QUERY = "name,utilization.gpu,memory.used,memory.total,temperature.gpu"
DEFAULT_TIMEOUT_S = 10.0


def nvidia_smi_command() -> str:
    # NOMAD_NVIDIA_SMI lets a sandbox (or a test) point at a stand-in binary.
    return os.environ.get("NOMAD_NVIDIA_SMI") or "nvidia-smi"


def query_gpus(timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """One nvidia-smi reading as the heartbeat's ``gpu`` object: {ok, error}."""
    binary = shutil.which(nvidia_smi_command())
    if binary is None:
        return unhealthy("nvidia-smi not found")
    args = [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
    try:
        code, out, err = _run_with_timeout(args, timeout_s)
    except subprocess.TimeoutExpired:
        return unhealthy(f"nvidia-smi did not answer within {timeout_s:g}s")
    except OSError as exc:
        return unhealthy(f"nvidia-smi could not run: {exc}")
    if code != 0:
        text = (err.strip() or out.strip() or "no output")[-500:]
        return unhealthy(f"nvidia-smi exited with {code}: {text}")
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        for line in lines:
            check_line(line)
    except ValueError as exc:
        return unhealthy(f"nvidia-smi output not understood: {exc}")
    if not lines:
        return unhealthy("nvidia-smi lists no GPUs")
    return {"ok": True, "error": None}


def unhealthy(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


def check_line(line: str) -> None:
    """Raise ValueError unless LINE reads as one GPU, e.g. 'NVIDIA GeForce RTX 4090, 97, 20123,
    24564, 61' (a number may be "[N/A]" or "[Not Supported]"): a driver in trouble prints
    something else."""
    fields = [field.strip() for field in line.rsplit(",", 4)]
    if len(fields) != 5:
        raise ValueError(f"{line.strip()[:100]!r} is not 5 fields")
    for text in fields[1:]:
        if not (text.startswith("[") or text in {"", "N/A"}):
            float(text)


def _run_with_timeout(args: list[str], timeout_s: float) -> tuple[int, str, str]:
    # Own session, so the whole group (a wrapper script and whatever it started) can be killed;
    # after the kill, wait only briefly: a process stuck in the driver may never die.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=2)  # else leave it: a process stuck in the driver
        raise
    return proc.returncode, out, err


class GpuMonitor:
    """Keeps the latest reading; ``latest`` is None until the first reading finishes."""

    def __init__(self, interval_s: float = 15.0, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.latest: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.latest = query_gpus(self.timeout_s)
            self._stop.wait(self.interval_s)
