"""The agent's life: register, put the job's code in place, run its setup, restore, run the
command, heartbeat, ship checkpoints, report exit.

Threads: heartbeat (state out, commands in), uploader (ready checkpoints out), GPU monitor
(nvidia-smi), output pump (the output of git, setup and the command), restore (the resume
checkpoint, downloaded beside code and setup: issue 30's measure 5, overlap). The main thread owns
the child process: it polls progress, applies stop/fence decisions and waits for the exit.
Nothing that happens to the supervisor connection stops training; only a dead token (401/410)
or a ``stop`` does.
"""

from __future__ import annotations

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

import agent
from agent import checkpoints as ck
from agent import launch, masking, procs, staging, workdir
from agent.assignment import Assignment, parse_assignment
from agent.client import (
    BadPayload,
    Refused,
    SignalFlag,
    SupervisorClient,
    TokenDead,
    call_until_answered,
)
from agent.gpu import GpuMonitor, unhealthy
from agent.heartbeat import Heartbeater
from agent.logs import TAIL_BYTES, LogTail, OutputPump, RotatingFile, TailHandler
from agent.masking import SecretMask
from agent.netdev import NetCounter
from agent.phases import PhaseClock
from agent.progress import ProgressWatcher
from agent.uploader import Uploader

log = logging.getLogger("agent")

EXIT_USAGE = 2  # bad invocation, or the supervisor rejected our registration as malformed
EXIT_FENCED = 3  # the token died: attempt over or fenced; nothing more was uploaded
EXIT_AGENT_ERROR = 4  # restore failed or the command could not start
EXIT_SETUP_FAILED = 5  # the job's code or setup failed; the command never ran
RESTORE_TRIES = 3
POLL_S = 0.25
T = TypeVar("T")


@dataclass
class Options:
    supervisor_url: str
    token: str
    workdir: Path
    checkpoint_dir: Path
    stop_grace_s: float = 30.0
    gpu_timeout_s: float = 10.0


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


class _Fenced(Exception):
    """The token died before the command started."""


class _Halted(Exception):
    """Stop, or a signal to the agent, before the command started; RETURNCODE is that of the
    step it ended (git, setup), None between steps."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(returncode)
        self.returncode = returncode


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
        self.pump: OutputPump | None = None
        self.storage = httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0))
        self.work_dir = options.workdir  # NOMAD_WORKDIR; the code's folder once register says
        self.grace_s = options.stop_grace_s
        # Secrets are masked in the tail and in our own log lines from the moment they arrive.
        self.mask = SecretMask()
        logging.getLogger().addHandler(TailHandler(self.tail))
        masking.install(self.mask)

    # --- the whole life ---------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        procs.become_subreaper()  # a launcher's orphaned ranks stay ours to stop (agent.procs)
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
        self.work_dir = workdir.work_directory(self.o.workdir, a.code)
        if a.stop_grace_s is not None:
            self.grace_s = a.stop_grace_s
        self._start_heartbeats(a)
        self.gpu.interval_s = a.heartbeat_interval_s
        self.gpu.expected_gpus = a.num_gpus
        self.gpu.start()
        try:
            resume_dir = self._prepare_and_restore(a)
            self._start_child(a, resume_dir)
        except _Fenced:
            return self._die_fenced()
        except _Halted as exc:
            return self._finish_without_command(*self._halt_report(exc.returncode))
        except SetupFailed as exc:
            log.error("%s", exc)
            return self._finish_without_command(exc.report(), EXIT_SETUP_FAILED)
        except (ck.RestoreError, ck.UnsafeArchive, OSError, ValueError) as exc:
            log.error("cannot start training: %s", exc)
            return self._finish_without_command(_agent_error(str(exc)), EXIT_AGENT_ERROR)
        except Exception as exc:  # a bug here must still end in an exit report
            log.exception("cannot start training")
            error = f"{type(exc).__name__}: {exc}"
            return self._finish_without_command(_agent_error(error), EXIT_AGENT_ERROR)
        if self.fenced.is_set():
            return self._die_fenced()
        return self._supervise(a)

    def _register(self, api: SupervisorClient) -> Assignment | None:
        self.gpu.latest = self.gpu.read()  # the first heartbeat's reading

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
            self.mask.set(a.secret_values())  # before anything could print one
            log.info("registered: job %s attempt %d", a.job_id, a.attempt_no)
            return a

    # --- code and setup -------------------------------------------------------------------

    def _prepare_and_restore(self, a: Assignment) -> Path | None:
        """Code and setup, and the resume checkpoint's restore; the folder restored into.

        The restore runs in its own thread beside code and setup (they share nothing: the
        checkpoint goes to its own folder, setup never sees it), so a recovery waits for the
        longer of the two, not their sum. Errors keep their order: a failing code or setup
        fails as it did without a restore (the restore is left behind, the agent exits); a
        failing restore is raised here once setup is done, as if it had run after it. The job's
        env ``NOMADGPU_RESTORE_OVERLAP=0`` runs them one after the other (the bench's baseline).
        """
        if not a.resume:
            self._prepare(a)
            return None
        if a.env.get("NOMADGPU_RESTORE_OVERLAP", "1") == "0":
            self._prepare(a)
            return self._restore(a)
        restore = _Background("restore", lambda: self._restore(a))
        self._prepare(a)
        return restore.result()

    def _prepare(self, a: Assignment) -> None:
        """The job's code, then its staged model files beside its setup, each done once per
        container (markers in the scratch folder, files found in place), each followed by its
        phase boundary.

        The staged files download in a thread while setup runs (a ``pip install`` needs no
        model), so the host waits for the longer of the two. Errors keep their order: a
        failing setup is the job's error even while the download goes on (it is left behind,
        the agent exits); a failing download is raised once setup is done. A setup that reads
        the staged files sets ``NOMADGPU_STAGE_OVERLAP=0`` in the job's env: then the download
        runs first, as before.
        """
        self._place_code(a)
        self.phases.mark("workdir_ready")
        self._halt_if_asked()  # a stop during the download: no setup for nothing
        if a.stage and a.setup.strip() and a.env.get("NOMADGPU_STAGE_OVERLAP", "1") != "0":
            staged = _Background("stage", lambda: self._stage_and_mark(a))
            self._setup(a)
            self.phases.mark("setup_done")
            staged.result()
        else:
            self._stage_and_mark(a)
            self._halt_if_asked()
            self._setup(a)
            self.phases.mark("setup_done")
        self._halt_if_asked()

    def _stage_and_mark(self, a: Assignment) -> None:
        if a.stage:
            self._stage(a)
        self.phases.mark("stage_done")  # also without a stage, as for code and setup

    def _place_code(self, a: Assignment) -> None:
        code, target = a.code, self.work_dir
        if code is None:
            return
        marker = self.o.workdir / workdir.CODE_MARKER
        if workdir.marker_matches(marker, code.identity) and target.is_dir():
            log.info("the code is already in %s (the agent was restarted)", target)
            return
        for name in (workdir.CODE_MARKER, workdir.SETUP_MARKER):  # setup ran on the old code
            (self.o.workdir / name).unlink(missing_ok=True)
        try:
            if code.kind == "archive":
                self._fetch_archive(code, target)
            else:
                env = {**_agent_env(), **a.env}
                workdir.fetch_git(code, target, scratch=self.o.workdir, env=env, run=self._git)
        except workdir.CodeError as exc:
            raise SetupFailed(str(exc)) from exc
        workdir.write_marker(marker, code.identity)
        log.info("code in place in %s", target)

    def _fetch_archive(self, code: workdir.Code, target: Path) -> None:
        assert code.object is not None
        log.info("fetching the code archive (%s bytes)", code.object["size"])
        scratch = self.o.workdir / ".code.download"
        self._with_retries(
            "code archive",
            lambda: workdir.fetch_archive(
                self.storage, code, target, scratch=scratch, counter=self.counter
            ),
        )

    def _stage(self, a: Assignment) -> None:
        total = sum(f.size for e in a.stage for f in e.files)
        log.info("fetching %d staged file(s), %d bytes", sum(len(e.files) for e in a.stage), total)
        started = time.monotonic()
        stats = self._with_retries(
            "staged files",
            lambda: staging.lay_out(
                self.storage, a.stage, hf_home=self._hf_home(a), stage_dir=self._stage_dir(),
                scratch=self.o.workdir / ".stage.download", counter=self.counter,
            ),
        )  # fmt: skip
        log.info(
            "staged files in place in %.1f s: %d fetched (%d bytes), %d already here",
            time.monotonic() - started,
            stats.files,
            stats.bytes,
            stats.reused,
        )

    def _hf_home(self, a: Assignment) -> Path:
        """Where the Hub's cache is laid out: the job's own HF_HOME, else the scratch folder's."""
        return Path(a.env.get("HF_HOME") or self.o.workdir / "hf")

    def _stage_dir(self) -> Path:
        return self.o.workdir / "stage"

    def _git(self, what: str, argv: list[str], cwd: Path, env: Mapping[str, str]) -> int:
        return self._run_step(what, argv, cwd=cwd, env=dict(env))

    def _setup(self, a: Assignment) -> None:
        if not a.setup.strip():
            return
        marker = self.o.workdir / workdir.SETUP_MARKER
        key = workdir.setup_key(a.job_id, a.code, a.setup)
        if workdir.marker_matches(marker, key):
            log.info("setup already ran in this container; skipping it")
            return
        script = self.o.workdir / "setup.sh"
        script.write_text(a.setup if a.setup.endswith("\n") else a.setup + "\n")
        shell = shutil.which("bash") or shutil.which("sh") or "/bin/sh"
        env = self._child_env(a, None)
        status = self._run_step("setup", [shell, "-e", str(script)], cwd=self.work_dir, env=env)
        if status != 0:
            raise SetupFailed(f"setup exited with {_describe(status)}", status)
        workdir.write_marker(marker, key)
        log.info("setup done")

    def _run_step(self, label: str, argv: list[str], *, cwd: Path, env: dict[str, str]) -> int:
        """Run one step before the command (git, setup) as the command runs: its own process
        group, output into the log, stopped as the command would be; its exit status.
        _Fenced or _Halted when the token died or a stop came meanwhile."""
        child = self._spawn(argv, cwd=cwd, env=env)
        log.info("started %s (pid %d)", label, child.pid)
        status = self._watch(child, label)
        self._signal_group(signal.SIGKILL)  # nothing of it may linger into the next step
        assert self.pump is not None
        self.pump.join(timeout=5)
        if status is None:
            raise _Fenced()
        self.child = None
        self._halt_if_asked(status)
        return status

    def _halt_if_asked(self, returncode: int | None = None) -> None:
        if self.fenced.is_set():
            raise _Fenced()
        if self.stop_requested.is_set() or self.terminated.is_set():
            raise _Halted(returncode)

    def _halt_report(self, returncode: int | None) -> tuple[dict[str, Any], int]:
        """The exit report and our exit status for a stop before the command started."""
        report = exit_report(
            returncode or 0,
            stopped=self.stop_requested.is_set(),
            terminated=self.terminated.is_set(),
        )
        if returncode is None:
            return {**report, "exit_code": None}, 128 + signal.SIGTERM
        return report, returncode if returncode >= 0 else 128 - returncode

    # --- restore --------------------------------------------------------------------------

    def _restore(self, a: Assignment) -> Path:
        resume = a.resume or {}
        step = int(resume["step"])
        if resume.get("encrypted") and a.data_key is None:
            raise ck.RestoreError("the checkpoint is encrypted but no key was given")
        plain_sha = None if resume.get("encrypted") else resume["object"].get("sha256")
        local = ck.local_copy(
            self.o.checkpoint_dir, resume.get("checkpoint_id"), step, sha256=plain_sha
        )
        if local is not None:
            return self._resume_from_disk(step, local)
        download = self.o.checkpoint_dir / f".resume-{step}.download"
        target = self.o.checkpoint_dir / f"resume-{step}"
        key = a.data_key if resume.get("encrypted") else None
        log.info("restoring checkpoint step %d (%s bytes)", step, resume["object"]["size"])
        # Downloads over parallel ranged GETs and unpacks as the bytes arrive; only a failed
        # download or sha256 is worth another try, not an unpack of good bytes.
        stats = self._with_retries(
            "checkpoint",
            lambda: ck.restore(
                self.storage, resume["object"], target, scratch=download, data_key=key,
                counter=self.counter,
            ),
        )  # fmt: skip
        ck.mark_restored(target, resume.get("checkpoint_id"))
        done = time.monotonic()
        self.phases.mark("restore_downloaded", done - (stats.total_s - stats.download_s))
        self.phases.mark("restore_unpacked", done)
        log.info(
            "restored checkpoint step %d into %s in %.1f s (download %.1f s, %d connection(s))",
            step,
            target,
            stats.total_s,
            stats.download_s,
            stats.connections,
        )
        return target

    def _resume_from_disk(self, step: int, local: Path) -> Path:
        """The checkpoint to resume from is already on this disk (the container restarted
        after its host rebooted, and Vast kept the disk): resume from it, downloading nothing;
        the restore's phase takes no time."""
        log.info("checkpoint step %d is already on this disk (%s): not downloading it", step, local)
        done = time.monotonic()
        self.phases.mark("restore_downloaded", done)
        self.phases.mark("restore_unpacked", done)
        return local

    def _with_retries(self, what: str, fetch: Callable[[], T]) -> T:
        """FETCH, tried RESTORE_TRIES times while it fails with DownloadError."""
        for attempt in range(1, RESTORE_TRIES + 1):
            try:
                return fetch()
            except ck.DownloadError as exc:
                if attempt == RESTORE_TRIES or self.fenced.is_set():
                    raise
                log.warning("%s download failed (%s); retrying", what, exc)
                time.sleep(attempt)
        raise AssertionError("unreachable")

    # --- the command ----------------------------------------------------------------------

    def _child_env(self, a: Assignment, resume_dir: Path | None) -> dict[str, str]:
        """The environment of setup and command: ours without the token, register's env and
        secrets (only here, never in our own environment), and the protocol's variables."""
        env = _agent_env()
        env.update(a.env)
        env.update(a.secrets)
        env.setdefault("PYTHONUNBUFFERED", "1")  # so output reaches the log as it happens
        # The agent's own location, so the script can `import agent` without installing it
        # (appended: a module called `agent` in the user's project still wins).
        here = str(Path(agent.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
        env.update(
            NOMAD_WORKDIR=str(self.work_dir),
            NOMAD_CHECKPOINT_DIR=str(self.o.checkpoint_dir),
            NOMAD_PROGRESS_FILE=str(self.progress.path),
            NOMAD_JOB_ID=a.job_id,
            NOMAD_ATTEMPT=str(a.attempt_no),
            NOMAD_CHECKPOINT_MODE=a.checkpoint_mode,
        )
        if a.stage:  # the staged cache is complete: from_pretrained needs no network call
            env.update(
                HF_HOME=str(self._hf_home(a)),
                # A job that still downloads from the Hub (a dataset) says HF_HUB_OFFLINE=0; the
                # staged blobs carry the Hub's etags, so an online lookup finds them anyway.
                HF_HUB_OFFLINE=a.env.get("HF_HUB_OFFLINE", "1"),
                NOMAD_STAGE_DIR=str(self._stage_dir()),
            )
        env.pop("NOMAD_RESUME_FROM", None)
        env.pop("NOMAD_TOTAL_STEPS", None)
        if resume_dir is not None:
            env["NOMAD_RESUME_FROM"] = str(resume_dir)
        if a.total_steps is not None:
            env["NOMAD_TOTAL_STEPS"] = str(a.total_steps)
        return env

    def _spawn(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ARGV as self.child, its output pumped into the log file, stdout and tail."""
        logfile = RotatingFile(self.o.workdir / "logs" / "train.log")
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
        self.child = child
        assert child.stdout is not None
        self.pump = OutputPump(child.stdout, logfile, self.tail, self.mask)
        self.pump.start()
        return child

    def _start_child(self, a: Assignment, resume_dir: Path | None) -> None:
        bash = shutil.which("bash") or "/bin/sh"
        env = self._child_env(a, resume_dir)
        command = launched_command(a, env)
        child = self._spawn([bash, "-c", command], cwd=self.work_dir, env=env)
        self.phases.mark("command_started")
        log.info("started command (pid %d): %s", child.pid, command)
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
        assert self.child is not None
        returncode = self._watch(self.child)
        if returncode is None:
            return self._die_fenced()
        return self._after_exit(a, returncode)

    def _watch(self, child: subprocess.Popen[bytes], what: str = "the command") -> int | None:
        """Wait for CHILD (WHAT, for the log) while applying stop and our own termination
        (SIGTERM to its group, SIGKILL after the grace); its return code, or None once the
        token died."""
        kill_at: float | None = None
        while child.poll() is None:
            self._poll_progress()
            if self.fenced.is_set():
                return None
            if kill_at is None and (self.stop_requested.is_set() or self.terminated.is_set()):
                if self.terminated.signum is not None:
                    log.warning("agent got signal %d", self.terminated.signum)
                log.info("stopping %s (SIGTERM, SIGKILL after %.0fs)", what, self.grace_s)
                self._signal_group(signal.SIGTERM)
                kill_at = time.monotonic() + self.grace_s
            if kill_at is not None and time.monotonic() > kill_at:
                self._signal_group(signal.SIGKILL)
            self.wakeup.wait(POLL_S)
            self.wakeup.clear()
        return child.returncode

    def _after_exit(self, a: Assignment, returncode: int) -> int:
        self._signal_group(signal.SIGKILL)  # leftovers (data loader workers) must not linger
        assert self.pump is not None
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
        report = {**report, "log_tail": self.tail.text(), **self._rank_failure(report)}
        if not self._report_exit(report):
            return EXIT_FENCED
        return returncode if returncode >= 0 else 128 - returncode

    def _rank_failure(self, report: dict[str, Any]) -> dict[str, str]:
        """For a multi-process command that failed: ``error`` naming the rank that failed
        first, read from the launcher's error summary in the output, and a log tail that
        starts with that rank's own last lines (the other ranks' tracebacks, as they were
        stopped, would push them out of the tail). Nothing for a run that did not fail, or
        without a summary."""
        if report["reason"] != "failed":
            return {}
        failure = launch.failed_rank(self.tail.text())
        if failure is None:
            return {}
        log.error("%s (see the launcher's summary above)", failure.describe())
        own = launch.rank_lines(self._output_end(), failure)
        if not own:
            return {"error": failure.describe(), "log_tail": self.tail.text()}
        head = "\n".join([f"[nomad-agent] rank {failure.rank}'s last lines:", *own])
        head = head.encode()[: TAIL_BYTES // 2].decode(errors="ignore")
        rest = self.tail.text(max_bytes=TAIL_BYTES - len(head.encode()) - 1)
        return {"error": failure.describe(), "log_tail": f"{head}\n{rest}"}

    def _output_end(self, size: int = 512 * 1024) -> str:
        """The last SIZE bytes of the command's log file (masked as it was written)."""
        path = self.o.workdir / "logs" / "train.log"
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

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

    def _finish_without_command(self, report: dict[str, Any], status: int) -> int:
        """Report an exit that came before the command ran; our exit STATUS if delivered."""
        if self.fenced.is_set():
            return self._die_fenced()
        self.phase = "exiting"
        self.heartbeater.send_final()  # type: ignore[union-attr]
        body = {"exit_code": None, "signal": None, **report, "log_tail": self.tail.text()}
        if body.get("error"):
            body["error"] = self.mask.apply(body["error"])[:2000]
        return status if self._report_exit(body) else EXIT_FENCED

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
        """SIGNUM to the command's process group, and to every other group among our
        descendants: the ranks a launcher started in sessions of their own (agent.procs)."""
        if self.child is None:
            return
        groups = [self.child.pid, *sorted(self._other_groups())]
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
                os.killpg(group, signum)

    def _other_groups(self) -> set[int]:
        """The process groups of the command's processes beyond its own group: those among our
        descendants with the command's environment (agent.procs), not our helpers'."""
        assert self.child is not None
        ours = procs.with_env(
            procs.descendants(os.getpid()), "NOMAD_PROGRESS_FILE", str(self.progress.path)
        )
        return procs.other_groups(ours, exclude=(os.getpgrp(), self.child.pid))

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited by the child, see above

        def on_terminate(signum: int, frame: object) -> None:
            self.terminated.set(signum)  # only a flag: no locks, no logging in a handler

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, on_terminate)


class _Background:
    """FN run in a daemon thread (a daemon: an agent that exits early need not wait for it);
    ``result`` waits for it and returns its value or raises its exception in the caller."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed to the caller of result(), which decides
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def launched_command(a: Assignment, env: Mapping[str, str]) -> str:
    """The bash text of A's command: as given, or wrapped in its launcher with one process
    per GPU (agent.launch), run by the command's own interpreter, else ``python3`` or
    ``python`` from the command's PATH."""
    if a.launcher is None:
        return a.command
    path = env.get("PATH")
    python = "python3" if shutil.which("python3", path=path) else "python"
    return launch.wrap_command(a.command, a.launcher, a.num_gpus, python=python)


def _agent_env() -> dict[str, str]:
    """Our environment without the token: it must never reach the job's processes."""
    return {k: v for k, v in os.environ.items() if k != "NOMAD_AGENT_TOKEN"}


def _agent_error(error: str) -> dict[str, Any]:
    return {"reason": "agent_error", "error": error}


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
