"""The NomadGPU checkpoint protocol for training scripts, plus the in-container agent.

A training script run by the agent uses these calls (standard library only, cheap to import)::

    from agent import checkpoint_mode, checkpoint_requested, mark_ready, report

    own_schedule = checkpoint_mode() == "script"   # "auto": the supervisor says when
    ...
    report(step, total_steps=300, loss=0.71)   # progress, shown live and used to spot stalls
    if checkpoint_requested() or (own_schedule and step % 50 == 0):
        save_everything_to(path)               # a directory under $NOMAD_CHECKPOINT_DIR
        mark_ready(path, step)                 # last: the agent uploads it from here on

On resume the agent sets ``$NOMAD_RESUME_FROM`` to the restored checkpoint directory.
Scripts in other languages follow the same protocol with files: write progress JSON to
``$NOMAD_PROGRESS_FILE`` (rename into place) and, after the checkpoint directory is complete,
create ``<dir>/NOMAD_READY`` holding the step number; ``$NOMAD_CHECKPOINT_MODE`` says whether
to keep their own schedule. See agent/PROTOCOL.md.

Everything heavy (httpx, cryptography) is imported by the agent's own modules only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import tempfile
import time

__version__ = "0.1.0"
__all__ = ["checkpoint_mode", "checkpoint_requested", "mark_ready", "report"]

READY_MARKER = "NOMAD_READY"
UPLOADED_MARKER = "NOMAD_UPLOADED"
# The job's checkpoint policy, as jobs.checkpoints.interval spells it (the agent cannot import it).
SCRIPT, AUTO = "script", "auto"

# Counted, not an Event: a signal handler must not take locks the interrupted code may hold.
_signals_seen = 0
_signals_handled = 0
_handler_installed = False


def report(step: int, total_steps: int | None = None, loss: float | None = None) -> None:
    """Publish training progress for the agent (no-op when not run by the agent)."""
    path = os.environ.get("NOMAD_PROGRESS_FILE")
    if not path:
        return
    if loss is not None:
        loss = float(loss)
        if not math.isfinite(loss):  # JSON has no NaN/inf; a diverged loss reads as unknown
            loss = None
    body = {"step": int(step), "total_steps": total_steps, "loss": loss, "time": time.time()}
    _write_atomically(path, json.dumps(body).encode())


def mark_ready(path: str | os.PathLike[str], step: int) -> None:
    """Declare the checkpoint directory PATH complete; call it after every file is written.

    The agent uploads the directory once it sees the marker. Do not change or delete the
    directory until the agent has written ``NOMAD_UPLOADED`` into it.
    """
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory} is not a checkpoint directory")
    _write_atomically(os.path.join(directory, READY_MARKER), f"{int(step)}\n".encode())


def checkpoint_requested() -> bool:
    """True once after the supervisor asked for a checkpoint (SIGUSR1), else False.

    The first call installs the signal handler; a request that arrives before it is ignored
    (the agent starts the command with SIGUSR1 ignored so that it cannot kill the script).
    Call it early, e.g. once before the training loop.
    """
    global _signals_handled
    _install_handler()
    seen = _signals_seen
    if seen == _signals_handled:
        return False
    _signals_handled = seen  # several requests since the last call count as one
    return True


def checkpoint_mode() -> str:
    """Who decides when to checkpoint: ``"auto"`` or ``"script"`` ($NOMAD_CHECKPOINT_MODE).

    ``"auto"``: the supervisor asks (``checkpoint_requested()``) at an interval it works out
    from the host's failure rate and the upload time; save only when asked (and when stopping
    or finishing): a schedule of the script's own would stall training for uploads that the
    interval was chosen to leave out. ``"script"`` (the default, also when not run by the
    agent): keep the script's own schedule; requests, e.g. before a planned move, come on top.
    """
    return AUTO if os.environ.get("NOMAD_CHECKPOINT_MODE") == AUTO else SCRIPT


def _install_handler() -> None:
    global _handler_installed
    if _handler_installed or not hasattr(signal, "SIGUSR1"):
        return
    try:
        previous = signal.getsignal(signal.SIGUSR1)

        def on_usr1(signum: int, frame: object) -> None:
            global _signals_seen
            _signals_seen += 1
            if callable(previous):  # chain a handler someone else installed (not SIG_IGN/DFL)
                previous(signum, frame)

        signal.signal(signal.SIGUSR1, on_usr1)
    except ValueError:  # not the main thread: signal handlers can only be set there
        return
    _handler_installed = True


def _write_atomically(path: str, data: bytes) -> None:
    # Write aside and rename: a reader sees the old content or the new one, never a torn file.
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nomad-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
