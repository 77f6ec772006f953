"""The container's own traffic, from the kernel's interface counters (``/proc/net/dev``).

Vast bills every byte the instance sends or receives, not only the checkpoints the agent moves
itself: a model the training command downloads costs the same per GB. So heartbeats also carry
the container's totals (``net_rx_bytes`` / ``net_tx_bytes``), summed over its interfaces without
the loopback, counted from the moment the agent started: what moved before (the image pull,
the bootstrap fetching the agent) is not in them; the supervisor estimates the pull itself.

``NOMAD_NET_DEV`` names another file in the same format: a sandbox whose "containers" share the
host's interfaces writes one per instance with the bytes it metered for it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

DEFAULT_PATH = "/proc/net/dev"
LOOPBACK = "lo"
TX_BYTES_COLUMN = 8  # after the eight receive columns: bytes packets errs drop fifo frame ...


def parse(text: str) -> dict[str, tuple[int, int]]:
    """Received and transmitted bytes per interface, the loopback left out."""
    counters = {}
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if not colon or name.strip() == LOOPBACK or len(fields) <= TX_BYTES_COLUMN:
            continue  # the two header lines have no colon
        try:
            counters[name.strip()] = (int(fields[0]), int(fields[TX_BYTES_COLUMN]))
        except ValueError:
            continue
    return counters


class NetCounter:
    """Bytes received and sent by the container since this counter was made.

    Interfaces are followed one by one, so one that appears later counts from zero and one
    whose counter went down (re-created) counts again from its new zero."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path or os.environ.get("NOMAD_NET_DEV") or DEFAULT_PATH)
        self._lock = threading.Lock()
        self._last = self._read() or {}
        self.rx = self.tx = 0

    def sample(self) -> tuple[int, int] | None:
        """(received, sent) so far, or None where the counters cannot be read (not Linux)."""
        now = self._read()
        if now is None:
            return None
        with self._lock:
            for name, (rx, tx) in now.items():
                last_rx, last_tx = self._last.get(name, (0, 0))
                self.rx += rx - last_rx if rx >= last_rx else rx
                self.tx += tx - last_tx if tx >= last_tx else tx
            self._last.update(now)  # one missing from a read is not a new interface later
            return self.rx, self.tx

    def _read(self) -> dict[str, tuple[int, int]] | None:
        try:
            return parse(self.path.read_text(errors="replace"))
        except OSError:
            return None
