"""Phase boundaries the agent reports (PROTOCOL.md, ``phases``): when the container came up,
the dependencies were ready, the checkpoint was downloaded and unpacked, the command started
and its first step arrived.

Each is kept as a moment on the monotonic clock and sent as *seconds before the call* that
carries it, so neither the host's wall clock nor the supervisor's matters; a boundary is sent
with every call until one carrying it is answered.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping

# What the bootstrap exports (Unix seconds on this host): its first line, and the moment the
# agent's dependencies were installed.
BOOTSTRAP_VARIABLES = (
    ("container_started", "NOMAD_CONTAINER_STARTED_AT"),
    ("deps_ready", "NOMAD_DEPS_READY_AT"),
)


class PhaseClock:
    def __init__(
        self,
        environ: Mapping[str, str] = os.environ,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._sent: set[str] = set()
        started = clock()
        offset = started - wall()  # the bootstrap's wall-clock moments, on our monotonic clock
        self._at: dict[str, float] = {}
        for name, variable in BOOTSTRAP_VARIABLES:
            value = _seconds(environ.get(variable))
            if value is not None:
                self._at[name] = min(value + offset, started)
        # Without the bootstrap's word, the agent's own start is all that is known.
        self._at.setdefault("deps_ready", started)

    def mark(self, name: str, at: float | None = None) -> None:
        """NAME happened at AT (monotonic; now when None), unless it was marked before."""
        with self._lock:
            self._at.setdefault(name, self.clock() if at is None else at)

    def pending(self) -> dict[str, float]:
        """The boundaries not yet delivered, as seconds before now."""
        now = self.clock()
        with self._lock:
            return {
                name: round(max(now - at, 0.0), 3)
                for name, at in self._at.items()
                if name not in self._sent
            }

    def delivered(self, names: Iterable[str]) -> None:
        with self._lock:
            self._sent.update(names)


def _seconds(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None
