"""What the agent's threads share, and how the agent speaks to the supervisor outside register:
the heartbeat (the snapshot out, commands in), our own signals, the exit report, and the end of
an attempt the supervisor fenced.

agent.runner's Agent builds on it and runs the attempt's phases in order; nothing here decides
an order. Options and the agent's exit statuses live here, beside the state they set up.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent import checkpoints as ck
from agent import masking
from agent.assignment import Assignment
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
from agent.logs import LogTail, TailHandler
from agent.masking import SecretMask
from agent.netdev import NetCounter
from agent.phases import PhaseClock
from agent.phases.child import Child
from agent.phases.downloads import Downloads
from agent.phases.meter import PhaseMeter
from agent.progress import ProgressWatcher
from agent.uploader import Uploader

log = logging.getLogger("agent")

EXIT_USAGE = 2  # bad invocation, or the supervisor rejected our registration as malformed
EXIT_FENCED = 3  # the token died: attempt over or fenced; nothing more was uploaded
EXIT_AGENT_ERROR = 4  # restore failed or the command could not start
EXIT_SETUP_FAILED = 5  # the job's code or setup failed; the command never ran


@dataclass
class Options:
    supervisor_url: str
    token: str
    workdir: Path
    checkpoint_dir: Path
    stop_grace_s: float = 30.0
    gpu_timeout_s: float = 10.0


class AgentState:
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
        self.heartbeater: Heartbeater | None = None
        self.uploader: Uploader | None = None
        self.storage = httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0))
        self.downloads = Downloads(self.storage, self.counter, self.fenced)
        # The early phases' bytes, sent with heartbeats until the command starts.
        self.meter = PhaseMeter(self._net_received)
        self.work_dir = options.workdir  # NOMAD_WORKDIR; the code's folder once register says
        # Secrets are masked in the tail and in our own log lines from the moment they arrive.
        self.mask = SecretMask()
        self.child = Child(
            log_path=options.workdir / "logs" / "train.log",
            tail=self.tail,
            mask=self.mask,
            progress_file=self.progress.path,
            on_poll=self._poll_progress,
            fenced=self.fenced,
            stop_requested=self.stop_requested,
            terminated=self.terminated,
            wakeup=self.wakeup,
            grace_s=options.stop_grace_s,
        )
        logging.getLogger().addHandler(TailHandler(self.tail))
        masking.install(self.mask)

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
        self.child.kill()
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
            **self._phase_progress(),
        }

    def _poll_progress(self) -> None:
        self.progress.poll()
        if self.progress.step is not None:
            self.phases.mark("first_step")  # once: later marks keep the first

    def _phases(self) -> dict[str, dict[str, float]]:
        pending = self.phases.pending()
        return {"phases": pending} if pending else {}

    def _phase_progress(self) -> dict[str, dict[str, Any]]:
        """The early phases' bytes while they run (before the command; PROTOCOL.md)."""
        if self.phase != "restoring":
            return {}
        progress = self.meter.snapshot()
        return {"phase_progress": progress} if progress else {}

    def _net_received(self) -> int | None:
        moved = self.net.sample()
        return None if moved is None else moved[0]

    def _net_bytes(self) -> dict[str, int]:
        moved = self.net.sample()
        return {} if moved is None else {"net_rx_bytes": moved[0], "net_tx_bytes": moved[1]}

    def _on_command(self, command: str) -> None:
        if command == "checkpoint_now":
            self.child.signal_group(signal.SIGUSR1)
        elif command == "stop":
            self.stop_requested.set()
            self.wakeup.set()

    def _token_dead(self) -> None:
        self.fenced.set()
        self.wakeup.set()

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited by the child (Child.spawn)

        def on_terminate(signum: int, frame: object) -> None:
            self.terminated.set(signum)  # only a flag: no locks, no logging in a handler

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, on_terminate)
