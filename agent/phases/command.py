"""The command phase, around the process itself (child.Child runs and watches that): the
environment the job's processes get, the command as launched, and the exit report made of how
it ended.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import agent
from agent import launch
from agent.assignment import Assignment
from agent.logs import TAIL_BYTES, LogTail
from agent.phases.stage import hf_home, stage_dir

log = logging.getLogger("agent")


def agent_env() -> dict[str, str]:
    """Our environment without the token: it must never reach the job's processes."""
    return {k: v for k, v in os.environ.items() if k != "NOMAD_AGENT_TOKEN"}


def child_env(
    a: Assignment,
    *,
    work_dir: Path,
    checkpoint_dir: Path,
    progress_file: Path,
    scratch: Path,
    resume_dir: Path | None,
) -> dict[str, str]:
    """The environment of setup and command: ours without the token, register's env and
    secrets (only here, never in our own environment), and the protocol's variables."""
    env = agent_env()
    env.update(a.env)
    env.update(a.secrets)
    env.setdefault("PYTHONUNBUFFERED", "1")  # so output reaches the log as it happens
    # The agent's own location, so the script can `import agent` without installing it
    # (appended: a module called `agent` in the user's project still wins).
    here = str(Path(agent.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    env.update(
        NOMAD_WORKDIR=str(work_dir),
        NOMAD_CHECKPOINT_DIR=str(checkpoint_dir),
        NOMAD_PROGRESS_FILE=str(progress_file),
        NOMAD_JOB_ID=a.job_id,
        NOMAD_ATTEMPT=str(a.attempt_no),
        NOMAD_CHECKPOINT_MODE=a.checkpoint_mode,
    )
    if a.stage:  # the staged cache is complete: from_pretrained needs no network call
        env.update(
            HF_HOME=str(hf_home(scratch, a.env)),
            # A job that still downloads from the Hub (a dataset) says HF_HUB_OFFLINE=0; the
            # staged blobs carry the Hub's etags, so an online lookup finds them anyway.
            HF_HUB_OFFLINE=a.env.get("HF_HUB_OFFLINE", "1"),
            NOMAD_STAGE_DIR=str(stage_dir(scratch)),
        )
    env.pop("NOMAD_RESUME_FROM", None)
    env.pop("NOMAD_TOTAL_STEPS", None)
    if resume_dir is not None:
        env["NOMAD_RESUME_FROM"] = str(resume_dir)
    if a.total_steps is not None:
        env["NOMAD_TOTAL_STEPS"] = str(a.total_steps)
    return env


def launched_command(a: Assignment, env: Mapping[str, str]) -> str:
    """The bash text of A's command: as given, or wrapped in its launcher with one process
    per GPU (agent.launch), run by the command's own interpreter, else ``python3`` or
    ``python`` from the command's PATH."""
    if a.launcher is None:
        return a.command
    path = env.get("PATH")
    python = "python3" if shutil.which("python3", path=path) else "python"
    return launch.wrap_command(a.command, a.launcher, a.num_gpus, python=python)


# --- how it ended ----------------------------------------------------------------------------


def exit_report(returncode: int, *, stopped: bool, terminated: bool) -> dict[str, Any]:
    """exit_code/signal/reason for the exit call, from Popen's returncode.

    A shell that did not exec the command reports a signal death as 128+n; that is read as
    signal n too, the usual shell convention.
    """
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if signum is not None and _signal_name(signum) is None:
        signum = None  # 128+n with no such signal: an ordinary exit code
    if stopped:
        reason = "stopped"
    elif terminated or signum:
        reason = "killed"
    else:
        reason = "finished" if returncode == 0 else "failed"
    exit_code = returncode if returncode >= 0 else None
    return {"exit_code": exit_code, "signal": signum, "reason": reason}


def halt_report(
    returncode: int | None, *, stopped: bool, terminated: bool
) -> tuple[dict[str, Any], int]:
    """The exit report and our exit status for a stop before the command started (RETURNCODE:
    that of the step it ended, None between steps)."""
    report = exit_report(returncode or 0, stopped=stopped, terminated=terminated)
    if returncode is None:
        return {**report, "exit_code": None}, 128 + signal.SIGTERM
    return report, returncode if returncode >= 0 else 128 - returncode


def rank_failure(report: dict[str, Any], *, tail: LogTail, log_path: Path) -> dict[str, str]:
    """For a multi-process command that failed: ``error`` naming the rank that failed
    first, read from the launcher's error summary in the output, and a log tail that
    starts with that rank's own last lines (the other ranks' tracebacks, as they were
    stopped, would push them out of the tail). Nothing for a run that did not fail, or
    without a summary."""
    if report["reason"] != "failed":
        return {}
    failure = launch.failed_rank(tail.text())
    if failure is None:
        return {}
    log.error("%s (see the launcher's summary above)", failure.describe())
    own = launch.rank_lines(_output_end(log_path), failure)
    if not own:
        return {"error": failure.describe(), "log_tail": tail.text()}
    head = "\n".join([f"[nomad-agent] rank {failure.rank}'s last lines:", *own])
    head = head.encode()[: TAIL_BYTES // 2].decode(errors="ignore")
    rest = tail.text(max_bytes=TAIL_BYTES - len(head.encode()) - 1)
    return {"error": failure.describe(), "log_tail": f"{head}\n{rest}"}


def _output_end(path: Path, size: int = 512 * 1024) -> str:
    """The last SIZE bytes of the command's log file PATH (masked as it was written)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def describe(returncode: int) -> str:
    if returncode < 0:
        return _signal_name(-returncode) or f"signal {-returncode}"
    return f"code {returncode}"


def _signal_name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None
