"""The one process the agent runs at a time: each git command, the setup script, the command.

Each is started the same way (a session and process group of its own, its output pumped into
the log file, the container's stdout and the tail) and watched the same way: while it runs the
progress file is polled, and a stop or a signal to the agent sends SIGTERM to its groups and
SIGKILL after the grace; a dead token ends the watch at once. Child is a class because that
state outlives a call: the heartbeat's ``checkpoint_now`` and the agent's endings signal the
process that is running, whichever step it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent import procs
from agent.client import SignalFlag
from agent.logs import LogTail, OutputPump, RotatingFile
from agent.masking import SecretMask

log = logging.getLogger("agent")

POLL_S = 0.25


class Fenced(Exception):
    """The token died before the command started."""


class Halted(Exception):
    """Stop, or a signal to the agent, before the command started; RETURNCODE is that of the
    step it ended (git, setup), None between steps."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(returncode)
        self.returncode = returncode


class Child:
    def __init__(
        self,
        *,
        log_path: Path,
        tail: LogTail,
        mask: SecretMask,
        progress_file: Path,
        on_poll: Callable[[], None],
        fenced: threading.Event,
        stop_requested: threading.Event,
        terminated: SignalFlag,
        wakeup: threading.Event,
        grace_s: float,
    ) -> None:
        self.log_path = log_path  # the output of every step and the command, rotated
        self.tail = tail
        self.mask = mask
        self.progress_file = progress_file  # NOMAD_PROGRESS_FILE: tells the command's processes
        self.on_poll = on_poll  # called each turn of the watch: the progress file is read
        self.fenced = fenced
        self.stop_requested = stop_requested
        self.terminated = terminated
        self.wakeup = wakeup
        self.grace_s = grace_s  # between SIGTERM and SIGKILL
        self.popen: subprocess.Popen[bytes] | None = None
        self.pump: OutputPump | None = None

    def spawn(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ARGV as the child, its output pumped into the log file, stdout and tail."""
        logfile = RotatingFile(self.log_path)
        # SIGUSR1 is ignored by us, so the child starts with it ignored: a checkpoint request
        # that arrives before the script listens cannot kill it (the default action).
        try:
            child = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, signalled as a whole
            )
        except BaseException:
            logfile.close()
            raise
        self.popen = child
        assert child.stdout is not None
        self.pump = OutputPump(child.stdout, logfile, self.tail, self.mask)
        self.pump.start()
        return child

    def watch(self, what: str = "the command") -> int | None:
        """Wait for the child (WHAT, for the log) while applying stop and our own termination
        (SIGTERM to its group, SIGKILL after the grace); its return code, or None once the
        token died."""
        child = self.popen
        assert child is not None
        kill_at: float | None = None
        while child.poll() is None:
            self.on_poll()
            if self.fenced.is_set():
                return None
            if kill_at is None and (self.stop_requested.is_set() or self.terminated.is_set()):
                if self.terminated.signum is not None:
                    log.warning("agent got signal %d", self.terminated.signum)
                log.info("stopping %s (SIGTERM, SIGKILL after %.0fs)", what, self.grace_s)
                self.signal_group(signal.SIGTERM)
                kill_at = time.monotonic() + self.grace_s
            if kill_at is not None and time.monotonic() > kill_at:
                self.signal_group(signal.SIGKILL)
            self.wakeup.wait(POLL_S)
            self.wakeup.clear()
        return child.returncode

    def run_step(self, label: str, argv: list[str], cwd: Path, env: Mapping[str, str]) -> int:
        """Run one step before the command (git, setup) as the command runs: its own process
        group, output into the log, stopped as the command would be; its exit status.
        Fenced or Halted when the token died or a stop came meanwhile."""
        child = self.spawn(argv, cwd=cwd, env=dict(env))
        log.info("started %s (pid %d)", label, child.pid)
        status = self.watch(label)
        self.reap()  # nothing of it may linger into the next step
        if status is None:
            raise Fenced()
        self.popen = None
        self.halt_if_asked(status)
        return status

    def reap(self) -> None:
        """After the child exited: SIGKILL what is left in its groups (a data loader's workers
        must not linger) and give its output 5 s to reach the log."""
        self.signal_group(signal.SIGKILL)
        assert self.pump is not None
        self.pump.join(timeout=5)

    def halt_if_asked(self, returncode: int | None = None) -> None:
        if self.fenced.is_set():
            raise Fenced()
        if self.stop_requested.is_set() or self.terminated.is_set():
            raise Halted(returncode)

    def kill(self) -> None:
        """SIGKILL the child's groups at once and wait for it (a fenced host's work can no
        longer be saved)."""
        if self.popen is not None:
            self.signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=30)  # a process stuck in the driver may not die

    def signal_group(self, signum: int) -> None:
        """SIGNUM to the child's process group, and to every other group among our
        descendants: the ranks a launcher started in sessions of their own (agent.procs)."""
        if self.popen is None:
            return
        groups = [self.popen.pid, *sorted(self._other_groups())]
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
                os.killpg(group, signum)

    def _other_groups(self) -> set[int]:
        """The process groups of the command's processes beyond its own group: those among our
        descendants with the command's environment (agent.procs), not our helpers'."""
        assert self.popen is not None
        ours = procs.with_env(
            procs.descendants(os.getpid()), "NOMAD_PROGRESS_FILE", str(self.progress_file)
        )
        return procs.other_groups(ours, exclude=(os.getpgrp(), self.popen.pid))
