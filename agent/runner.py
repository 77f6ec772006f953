"""The agent's life: register, restore, run the command, heartbeat, ship checkpoints, report exit.

Threads: heartbeat (state out, commands in), uploader (ready checkpoints out), GPU monitor
(nvidia-smi), output pump (the command's output). The main thread owns the child process: it
polls progress, applies stop/fence decisions and waits for the exit. Nothing that happens to
the supervisor connection stops training; only a dead token (401/410) or a ``stop`` does.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import agent
from agent import checkpoints as ck
from agent.client import (
    BadPayload,
    Refused,
    SignalFlag,
    SupervisorClient,
    TokenDead,
    call_until_answered,
)
from agent.gpu import GpuMonitor, query_gpus, unhealthy
from agent.heartbeat import Heartbeater, clamp_interval
from agent.logs import LogTail, OutputPump, RotatingFile, TailHandler
from agent.netdev import NetCounter
from agent.phases import PhaseClock
from agent.progress import ProgressWatcher
from agent.uploader import Uploader

log = logging.getLogger("agent")

EXIT_USAGE = 2  # bad invocation, or the supervisor rejected our registration as malformed
EXIT_FENCED = 3  # the token died: attempt over or fenced; nothing more was uploaded
EXIT_AGENT_ERROR = 4  # restore failed or the command could not start
RESTORE_TRIES = 3
POLL_S = 0.25


@dataclass
class Options:
    supervisor_url: str
    token: str
    workdir: Path
    checkpoint_dir: Path
    stop_grace_s: float = 30.0
    gpu_timeout_s: float = 10.0


@dataclass
class Assignment:
    """What register told us to do."""

    job_id: str
    attempt_no: int
    command: str
    env: dict[str, str]
    heartbeat_interval_s: float
    total_steps: int | None
    resume: dict[str, Any] | None
    data_key: bytes | None
    stop_grace_s: float | None = None
    checkpoint_mode: str = agent.SCRIPT
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_assignment(reply: dict[str, Any]) -> Assignment:
    """Read the register reply; KeyError/TypeError/ValueError when it is malformed."""
    encryption = reply.get("encryption")
    data_key = None
    if encryption:
        if encryption.get("format", "ngck1") != "ngck1":
            raise ValueError(f"unknown encryption format {encryption.get('format')!r}")
        data_key = base64.b64decode(encryption["data_key_b64"], validate=True)
        if len(data_key) != 32:
            raise ValueError("the data key must be 32 bytes")
    command = reply["command"]
    if not isinstance(command, str) or not command.strip():
        raise ValueError("empty command")
    total = reply.get("total_steps")
    grace = reply.get("stop_grace_s")
    return Assignment(
        job_id=str(reply["job_id"]),
        attempt_no=int(reply["attempt_no"]),
        command=command,
        env={str(k): str(v) for k, v in (reply.get("env") or {}).items()},
        heartbeat_interval_s=clamp_interval(reply.get("heartbeat_interval_s"), 15.0),
        total_steps=int(total) if total is not None else None,
        resume=reply.get("resume") or None,
        data_key=data_key,
        stop_grace_s=float(grace) if grace is not None else None,
        checkpoint_mode=mode_from_reply(reply.get("checkpoint")),
        raw=reply,
    )


def mode_from_reply(checkpoint: Any) -> str:
    """Register's ``checkpoint.mode``; ``script`` from a server too old to send one (it never
    asks for checkpoints on its own) and for a value this agent does not know."""
    mode = checkpoint.get("mode") if isinstance(checkpoint, dict) else None
    return agent.AUTO if mode == agent.AUTO else agent.SCRIPT


class Agent:
    def __init__(self, options: Options) -> None:
        self.o = options
        self.phases = PhaseClock()  # first: the agent's start is a boundary
        self.tail = LogTail()
        self.counter = ck.ByteCounter()
        self.net = NetCounter()  # the baseline: what moved before the agent started is not ours
        self.progress = ProgressWatcher(options.workdir / "progress.json")
        self.gpu = GpuMonitor(timeout_s=options.gpu_timeout_s)
        self.fenced = threading.Event()  # token dead: kill, upload nothing, exit
        self.stop_requested = threading.Event()  # supervisor said stop
        self.terminated = SignalFlag()  # we got SIGTERM/SIGINT/SIGHUP (set in a handler)
        self.wakeup = threading.Event()
        self.phase = "restoring"
        self.child: subprocess.Popen[bytes] | None = None
        self.heartbeater: Heartbeater | None = None
        self.uploader: Uploader | None = None
        self.storage = httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0))
        logging.getLogger().addHandler(TailHandler(self.tail))

    # --- the whole life ---------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        api = SupervisorClient(self.o.supervisor_url, self.o.token)
        try:
            assignment = self._register(api)
        except TokenDead as exc:
            log.error("the supervisor does not accept this token (%s); exiting", exc)
            return EXIT_FENCED
        except (BadPayload, KeyError, TypeError, ValueError) as exc:
            log.error("registration failed: %s", exc)
            return EXIT_USAGE
        if assignment is None:
            return EXIT_FENCED if self.fenced.is_set() else 128 + signal.SIGTERM
        return self._run_assignment(api, assignment)

    def _run_assignment(self, api: SupervisorClient, a: Assignment) -> int:
        self.o.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.progress.path.unlink(missing_ok=True)  # a stale file from an earlier run lies
        self._start_heartbeats(a)
        self.gpu.interval_s = a.heartbeat_interval_s
        self.gpu.start()
        try:
            resume_dir = self._restore(a) if a.resume else None
            self._start_child(a, resume_dir)
        except (ck.RestoreError, ck.UnsafeArchive, OSError, ValueError) as exc:
            log.error("cannot start training: %s", exc)
            return self._finish_without_child(api, str(exc))
        except Exception as exc:  # a bug here must still end in an exit report
            log.exception("cannot start training")
            return self._finish_without_child(api, f"{type(exc).__name__}: {exc}")
        if self.fenced.is_set():
            return self._die_fenced()
        return self._supervise(a)

    def _register(self, api: SupervisorClient) -> Assignment | None:
        self.gpu.latest = query_gpus(self.o.gpu_timeout_s)  # the first heartbeat's reading

        def body() -> dict[str, Any]:  # the phases' ages as of each try
            return {
                "agent_version": agent.__version__,
                "hostname": socket.gethostname(),
                "python": platform.python_version(),
                "phases": self.phases.pending(),
            }

        while True:
            try:
                reply = call_until_answered(api, "register", body, stop=self.terminated)
            except Refused as exc:  # e.g. not yet registrable; the supervisor decides
                log.warning("register refused (%s); retrying", exc)
                if self.terminated.wait(5):
                    return None
                continue
            if reply is None:
                return None
            self.phases.delivered(("container_started", "deps_ready"))
            a = parse_assignment(reply)
            log.info("registered: job %s attempt %d", a.job_id, a.attempt_no)
            return a

    # --- restore --------------------------------------------------------------------------

    def _restore(self, a: Assignment) -> Path:
        resume = a.resume or {}
        step = int(resume["step"])
        if resume.get("encrypted") and a.data_key is None:
            raise ck.RestoreError("the checkpoint is encrypted but no key was given")
        download = self.o.checkpoint_dir / f".resume-{step}.download"
        target = self.o.checkpoint_dir / f"resume-{step}"
        key = a.data_key if resume.get("encrypted") else None
        log.info("restoring checkpoint step %d (%s bytes)", step, resume["object"]["size"])
        for attempt in range(1, RESTORE_TRIES + 1):
            try:
                # Downloads over parallel ranged GETs and unpacks as the bytes arrive; only a
                # failed download or sha256 is worth another try, not an unpack of good bytes.
                stats = ck.restore(
                    self.storage,
                    resume["object"],
                    target,
                    scratch=download,
                    data_key=key,
                    counter=self.counter,
                )
                done = time.monotonic()
                self.phases.mark("restore_downloaded", done - (stats.total_s - stats.download_s))
                self.phases.mark("restore_unpacked", done)
                break
            except ck.DownloadError as exc:
                if attempt == RESTORE_TRIES or self.fenced.is_set():
                    raise
                log.warning("download failed (%s); retrying", exc)
                time.sleep(attempt)
        log.info(
            "restored checkpoint step %d into %s in %.1f s (download %.1f s, %d connection(s))",
            step,
            target,
            stats.total_s,
            stats.download_s,
            stats.connections,
        )
        return target

    # --- the command ----------------------------------------------------------------------

    def _child_env(self, a: Assignment, resume_dir: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "NOMAD_AGENT_TOKEN"}
        env.update(a.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # so output reaches the log as it happens
        # The agent's own location, so the script can `import agent` without installing it
        # (appended: a module called `agent` in the user's project still wins).
        here = str(Path(agent.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
        env.update(
            NOMAD_CHECKPOINT_DIR=str(self.o.checkpoint_dir),
            NOMAD_PROGRESS_FILE=str(self.progress.path),
            NOMAD_JOB_ID=a.job_id,
            NOMAD_ATTEMPT=str(a.attempt_no),
            NOMAD_CHECKPOINT_MODE=a.checkpoint_mode,
        )
        env.pop("NOMAD_RESUME_FROM", None)
        env.pop("NOMAD_TOTAL_STEPS", None)
        if resume_dir is not None:
            env["NOMAD_RESUME_FROM"] = str(resume_dir)
        if a.total_steps is not None:
            env["NOMAD_TOTAL_STEPS"] = str(a.total_steps)
        return env

    def _start_child(self, a: Assignment, resume_dir: Path | None) -> None:
        bash = shutil.which("bash") or "/bin/sh"
        logfile = RotatingFile(self.o.workdir / "logs" / "train.log")
        # SIGUSR1 is ignored by us, so the child starts with it ignored: a checkpoint request
        # that arrives before the script listens cannot kill it (the default action).
        self.child = subprocess.Popen(
            [bash, "-c", a.command],
            env=self._child_env(a, resume_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, signalled as a whole
        )
        self.phases.mark("command_started")
        assert self.child.stdout is not None
        self.pump = OutputPump(self.child.stdout, logfile, self.tail)
        self.pump.start()
        log.info("started command (pid %d): %s", self.child.pid, a.command)
        self.phase = "running"
        self.heartbeater.wake()  # type: ignore[union-attr]
        self.uploader = Uploader(
            api=SupervisorClient(self.o.supervisor_url, self.o.token),
            storage=self.storage,
            checkpoint_dir=self.o.checkpoint_dir,
            data_key=a.data_key,
            counter=self.counter,
            fenced=self.fenced,
            on_token_dead=self._token_dead,
        )
        self.uploader.start()

    def _supervise(self, a: Assignment) -> int:
        child = self.child
        assert child is not None
        grace = a.stop_grace_s if a.stop_grace_s is not None else self.o.stop_grace_s
        kill_at: float | None = None
        while child.poll() is None:
            self._poll_progress()
            if self.fenced.is_set():
                return self._die_fenced()
            if kill_at is None and (self.stop_requested.is_set() or self.terminated.is_set()):
                if self.terminated.signum is not None:
                    log.warning("agent got signal %d", self.terminated.signum)
                log.info("stopping the command (SIGTERM, SIGKILL after %.0fs)", grace)
                self._signal_group(signal.SIGTERM)
                kill_at = time.monotonic() + grace
            if kill_at is not None and time.monotonic() > kill_at:
                self._signal_group(signal.SIGKILL)
            self.wakeup.wait(POLL_S)
            self.wakeup.clear()
        return self._after_exit(a, child.returncode)

    def _after_exit(self, a: Assignment, returncode: int) -> int:
        self._signal_group(signal.SIGKILL)  # leftovers (data loader workers) must not linger
        self.pump.join(timeout=5)
        self._poll_progress()
        self.phase = "exiting"
        log.info("command exited with %s", _describe(returncode))
        self.heartbeater.wake()  # type: ignore[union-attr]
        assert self.uploader is not None
        while not self.uploader.finish(timeout=POLL_S):
            if self.fenced.is_set():
                return self._die_fenced()
        self.heartbeater.send_final()  # type: ignore[union-attr]
        if self.fenced.is_set():
            return self._die_fenced()
        report = exit_report(
            returncode,
            stopped=self.stop_requested.is_set(),
            terminated=self.terminated.is_set(),
        )
        if not self._report_exit({**report, "log_tail": self.tail.text()}):
            return EXIT_FENCED
        return returncode if returncode >= 0 else 128 - returncode

    # --- endings ----------------------------------------------------------------------------

    def _report_exit(self, body: dict[str, Any]) -> bool:
        """Deliver the exit report; False when the token died first.

        (A heartbeat still in flight may meet the 410 that follows an accepted exit: only
        this call's own answer counts.)
        """
        api = SupervisorClient(self.o.supervisor_url, self.o.token)
        try:
            reply = call_until_answered(api, "exit", body, stop=self.fenced)
        except TokenDead as exc:
            log.error("exit not accepted: %s", exc)
            return False
        except (Refused, BadPayload) as exc:
            log.error("exit report rejected: %s", exc)
            reply = {}
        finally:
            self.heartbeater.stop()  # type: ignore[union-attr]
            self.gpu.stop()
        return reply is not None

    def _finish_without_child(self, api: SupervisorClient, error: str) -> int:
        if self.fenced.is_set():
            return self._die_fenced()
        self.phase = "exiting"
        body = {
            "exit_code": None,
            "signal": None,
            "reason": "agent_error",
            "error": error[:2000],
            "log_tail": self.tail.text(),
        }
        return EXIT_AGENT_ERROR if self._report_exit(body) else EXIT_FENCED

    def _die_fenced(self) -> int:
        # A fenced host is a zombie: its work can no longer be saved, so kill at once.
        log.error("attempt is over on the supervisor: killing the command, uploading nothing")
        if self.child is not None:
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(timeout=30)  # a process stuck in the driver may not die
        if self.heartbeater is not None:
            self.heartbeater.stop()
        self.gpu.stop()
        return EXIT_FENCED

    # --- plumbing -------------------------------------------------------------------------

    def _start_heartbeats(self, a: Assignment) -> None:
        self.heartbeater = Heartbeater(
            api=SupervisorClient(self.o.supervisor_url, self.o.token),
            interval_s=a.heartbeat_interval_s,
            # Wall-clock milliseconds: above any seq an earlier agent of this attempt sent
            # (a container restart runs us again), with no state kept anywhere.
            last_seq=int(time.time() * 1000),
            snapshot=self.snapshot,
            on_command=self._on_command,
            on_token_dead=self._token_dead,
            on_delivered=lambda body: self.phases.delivered(body.get("phases", ())),
        )
        self.heartbeater.start()

    def snapshot(self) -> dict[str, Any]:
        busy = self.uploader is not None and self.uploader.busy
        phase = "uploading" if self.phase == "running" and busy else self.phase
        return {
            "phase": phase,
            "step": self.progress.step,
            "total_steps": self.progress.total_steps,
            "loss": self.progress.loss,
            "seconds_per_step": self.progress.seconds_per_step,
            "gpu": self.gpu.latest or unhealthy("not measured yet"),
            "bytes_down": self.counter.down,
            "bytes_up": self.counter.up,
            **self._net_bytes(),
            "log_tail": self.tail.text(),
            **self._phases(),
        }

    def _poll_progress(self) -> None:
        self.progress.poll()
        if self.progress.step is not None:
            self.phases.mark("first_step")  # once: later marks keep the first

    def _phases(self) -> dict[str, dict[str, float]]:
        pending = self.phases.pending()
        return {"phases": pending} if pending else {}

    def _net_bytes(self) -> dict[str, int]:
        moved = self.net.sample()
        return {} if moved is None else {"net_rx_bytes": moved[0], "net_tx_bytes": moved[1]}

    def _on_command(self, command: str) -> None:
        if command == "checkpoint_now":
            self._signal_group(signal.SIGUSR1)
        elif command == "stop":
            self.stop_requested.set()
            self.wakeup.set()

    def _token_dead(self) -> None:
        self.fenced.set()
        self.wakeup.set()

    def _signal_group(self, signum: int) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
            os.killpg(self.child.pid, signum)

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited by the child, see above

        def on_terminate(signum: int, frame: object) -> None:
            self.terminated.set(signum)  # only a flag: no locks, no logging in a handler

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, on_terminate)


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


def _signal_name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def _describe(returncode: int) -> str:
    if returncode < 0:
        return _signal_name(-returncode) or f"signal {-returncode}"
    return f"code {returncode}"
