"""The early phases' bytes (PROTOCOL.md, heartbeat ``phase_progress``): what code, stage, setup
and restore have moved so far, and of what total, so that the supervisor can tell a slow
start-up from one that stopped moving.

Code (an archive), stage and restore count the object bytes they download: each gets a
``Downloads`` whose counter (``PhaseCounter``) adds to its phase as well as to the agent's
total. Setup, and code from git, download through programs of their own (pip, git): they count
every byte the container received meanwhile (``NetCounter``; the staged files and a restore
running beside them included), with no total, so the supervisor never judges them by bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent import checkpoints as ck


class PhaseMeter:
    """Each early phase begun: bytes done, bytes total (None: unknown), whether it ended. Shared
    by the phases' threads and the heartbeat's."""

    def __init__(self, net_received: Callable[[], int | None] = lambda: None) -> None:
        """NET_RECEIVED: the container's bytes received so far (None: not readable)."""
        self._lock = threading.Lock()
        self._net_received = net_received
        self._phases: dict[str, dict[str, Any]] = {}
        self._net_base: dict[str, int] = {}  # phases counted by the container's counters

    def begin(self, name: str, total: int | None) -> None:
        """NAME starts, with TOTAL bytes to download (None: unknown): counted by its counter."""
        with self._lock:
            self._phases[name] = {"bytes_done": 0, "bytes_total": total, "done": False}

    def begin_by_network(self, name: str) -> None:
        """NAME starts and downloads through a program of its own: every byte the container
        receives from now on counts, with no total (none when the counters cannot be read)."""
        base = self._net_received()
        with self._lock:
            self._phases[name] = {"bytes_done": 0, "bytes_total": None, "done": False}
            if base is not None:
                self._net_base[name] = base

    def add(self, name: str, nbytes: int) -> None:
        with self._lock:
            if name in self._phases:
                self._phases[name]["bytes_done"] += nbytes

    def end(self, name: str) -> None:
        """NAME ended (its bytes as counted so far stay)."""
        self._refresh_network()
        with self._lock:
            if name in self._phases:
                self._phases[name]["done"] = True
                self._net_base.pop(name, None)

    def counter(self, name: str, parent: ck.ByteCounter) -> PhaseCounter:
        """The byte counter a phase's downloads add to: NAME's bytes, and PARENT's."""
        return PhaseCounter(self, name, parent)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every phase begun, for a heartbeat: ``{name: {bytes_done, bytes_total, done}}``."""
        self._refresh_network()
        with self._lock:
            return {name: dict(p) for name, p in self._phases.items()}

    def _refresh_network(self) -> None:
        if not self._net_base:
            return
        received = self._net_received()
        if received is None:
            return
        with self._lock:
            for name, base in self._net_base.items():
                self._phases[name]["bytes_done"] = max(received - base, 0)


class PhaseCounter(ck.ByteCounter):
    """A byte counter that adds a phase's downloads to its meter as well as to the agent's
    counter (the heartbeat's ``bytes_down``); its own totals count that phase alone."""

    def __init__(self, meter: PhaseMeter, name: str, parent: ck.ByteCounter) -> None:
        super().__init__()
        self._meter, self._name, self._parent = meter, name, parent

    def add(self, *, down: int = 0, up: int = 0) -> None:
        super().add(down=down, up=up)
        self._parent.add(down=down, up=up)
        if down:
            self._meter.add(self._name, down)
