"""The agent's life: register, put the job's code in place, run its setup, restore, run the
command, heartbeat, ship checkpoints, report exit.

Threads: heartbeat (state out, commands in), uploader (ready checkpoints out), GPU monitor
(nvidia-smi), output pump (the output of git, setup and the command), restore (the resume
checkpoint, downloaded beside code and setup: issue 30's measure 5, overlap). The main thread owns
the child process: it polls progress, applies stop/fence decisions and waits for the exit.
Nothing that happens to the supervisor connection stops training; only a dead token (401/410)
or a ``stop`` does.

The Agent runs the phases in order and overlaps those that share nothing. Each phase is a
function in agent/phases/ (code, stage, setup, restore, command; why functions: see that
package's docstring), given what it reads and returning what it made; the state they share
(the storage client, the byte counter, the stop and fence flags, the running child) and the
heartbeats, the exit report and the fenced end are agent.state's AgentState, which the Agent
extends.
"""

from __future__ import annotations

import logging
import platform
import shutil
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agent
from agent import checkpoints as ck
from agent import procs, workdir
from agent.assignment import Assignment, parse_assignment
from agent.client import BadPayload, Refused, SupervisorClient, TokenDead, call_until_answered
from agent.phases.child import POLL_S, Fenced, Halted
from agent.phases.code import place_code
from agent.phases.command import (
    child_env,
    describe,
    exit_report,
    halt_report,
    launched_command,
    rank_failure,
)
from agent.phases.restore import restore_checkpoint
from agent.phases.setup import SetupFailed, run_setup
from agent.phases.stage import fetch_staged, hf_home, stage_dir
from agent.state import (
    EXIT_AGENT_ERROR,
    EXIT_FENCED,
    EXIT_SETUP_FAILED,
    EXIT_USAGE,
    AgentState,
    Options,
)
from agent.uploader import Uploader

log = logging.getLogger("agent")

__all__ = ["Agent", "Options"]  # Options from agent.state: `Agent(Options(...)).run()`


class Agent(AgentState):
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
            self.child.grace_s = a.stop_grace_s
        self._start_heartbeats(a)
        self.gpu.interval_s = a.heartbeat_interval_s
        self.gpu.expected_gpus = a.num_gpus
        self.gpu.start()
        try:
            resume_dir = self._prepare_and_restore(a)
            self._start_child(a, resume_dir)
        except Fenced:
            return self._die_fenced()
        except Halted as exc:
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

    # --- the phases before the command, and their overlap -------------------------------------

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
        self.child.halt_if_asked()  # a stop during the download: no setup for nothing
        if a.stage and a.setup.strip() and a.env.get("NOMADGPU_STAGE_OVERLAP", "1") != "0":
            staged = _Background("stage", lambda: self._stage_and_mark(a))
            self._setup(a)
            self.phases.mark("setup_done")
            staged.result()
        else:
            self._stage_and_mark(a)
            self.child.halt_if_asked()
            self._setup(a)
            self.phases.mark("setup_done")
        self.child.halt_if_asked()

    def _stage_and_mark(self, a: Assignment) -> None:
        if a.stage:
            self._stage(a)
        self.phases.mark("stage_done")  # also without a stage, as for code and setup

    # Each early phase reports its bytes (self.meter, PROTOCOL.md ``phase_progress``): code
    # from an archive, stage and restore count their downloads; git and setup the container's.

    def _place_code(self, a: Assignment) -> None:
        if a.code is None:
            return
        downloads = self.downloads
        if a.code.kind == "archive" and a.code.object is not None:
            downloads = downloads.for_phase(self.meter, "code", int(a.code.object["size"]))
        else:
            self.meter.begin_by_network("code")
        place_code(
            a.code, target=self.work_dir, scratch=self.o.workdir, job_env=a.env,
            downloads=downloads, run=self.child.run_step,
        )  # fmt: skip
        self.meter.end("code")

    def _stage(self, a: Assignment) -> None:
        total = sum(int(f.object["size"]) for entry in a.stage for f in entry.files)
        fetch_staged(
            a.stage, hf_home=hf_home(self.o.workdir, a.env), stage_dir=stage_dir(self.o.workdir),
            scratch=self.o.workdir, downloads=self.downloads.for_phase(self.meter, "stage", total),
        )  # fmt: skip
        self.meter.end("stage")

    def _setup(self, a: Assignment) -> None:
        if a.setup.strip():
            self.meter.begin_by_network("setup")
        run_setup(
            a.setup, key=workdir.setup_key(a.job_id, a.code, a.setup), scratch=self.o.workdir,
            cwd=self.work_dir, env=self._child_env(a, None), run=self.child.run_step,
        )  # fmt: skip
        self.meter.end("setup")

    def _restore(self, a: Assignment) -> Path:
        size = int(((a.resume or {}).get("object") or {}).get("size") or 0)
        restored = restore_checkpoint(
            a.resume or {}, data_key=a.data_key, checkpoint_dir=self.o.checkpoint_dir,
            downloads=self.downloads.for_phase(self.meter, "restore", size or None),
        )  # fmt: skip
        self.meter.end("restore")
        self.phases.mark("restore_downloaded", restored.downloaded_at)
        self.phases.mark("restore_unpacked", restored.unpacked_at)
        return restored.path

    def _halt_report(self, returncode: int | None) -> tuple[dict[str, Any], int]:
        """The exit report and our exit status for a stop before the command started."""
        return halt_report(
            returncode,
            stopped=self.stop_requested.is_set(),
            terminated=self.terminated.is_set(),
        )

    # --- the command ----------------------------------------------------------------------

    def _child_env(self, a: Assignment, resume_dir: Path | None) -> dict[str, str]:
        return child_env(
            a, work_dir=self.work_dir, checkpoint_dir=self.o.checkpoint_dir,
            progress_file=self.progress.path, scratch=self.o.workdir, resume_dir=resume_dir,
        )  # fmt: skip

    def _start_child(self, a: Assignment, resume_dir: Path | None) -> None:
        bash = shutil.which("bash") or "/bin/sh"
        env = self._child_env(a, resume_dir)
        command = launched_command(a, env)
        popen = self.child.spawn([bash, "-c", command], cwd=self.work_dir, env=env)
        self.phases.mark("command_started")
        log.info("started command (pid %d): %s", popen.pid, command)
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
        returncode = self.child.watch()
        if returncode is None:
            return self._die_fenced()
        return self._after_exit(a, returncode)

    def _after_exit(self, a: Assignment, returncode: int) -> int:
        self.child.reap()
        self._poll_progress()
        self.phase = "exiting"
        log.info("command exited with %s", describe(returncode))
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
        tail = self.tail.text()  # read before rank_failure logs what it finds
        failure = rank_failure(report, tail=self.tail, log_path=self.child.log_path)
        report = {**report, "log_tail": tail, **failure}
        if not self._report_exit(report):
            return EXIT_FENCED
        return returncode if returncode >= 0 else 128 - returncode


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


def _agent_error(error: str) -> dict[str, Any]:
    return {"reason": "agent_error", "error": error}
