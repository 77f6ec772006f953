"""What every transfer shares: the counter of object bytes moved, and how much is read at once."""

from __future__ import annotations

import threading

READ_CHUNK = 1024 * 1024


class ByteCounter:
    """Object bytes moved by this agent (heartbeat bytes_down/bytes_up), shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down = 0
        self.up = 0

    def add(self, *, down: int = 0, up: int = 0) -> None:
        with self._lock:
            self.down += down
            self.up += up
