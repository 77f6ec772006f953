"""The training command's output: a rotating file on disk, the container's stdout, and a short
in-memory tail that goes out with every heartbeat."""

from __future__ import annotations

import codecs
import logging
import re
import sys
import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO

from agent.masking import SecretMask

TAIL_LINES = 50
TAIL_BYTES = 8 * 1024
LINE_CHARS = 1000
_BREAKS = re.compile(r"(\r\n|\n|\r)")


class LogTail:
    """The last lines of output. A bare carriage return overwrites the current line, the way a
    terminal shows progress bars, so a tqdm bar is one line and not thousands."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._pending = ""
        self._after_cr = False
        self._lock = threading.Lock()

    def feed(self, text: str) -> None:
        with self._lock:
            for piece in _BREAKS.split(text):
                if piece in ("\n", "\r\n"):
                    self._lines.append(self._pending)
                    self._pending, self._after_cr = "", False
                elif piece == "\r":
                    self._after_cr = True
                elif piece:
                    if self._after_cr:
                        self._pending, self._after_cr = "", False
                    self._pending = (self._pending + piece)[:LINE_CHARS]

    def add_line(self, line: str) -> None:
        with self._lock:
            self._lines.append(line[:LINE_CHARS])

    def text(self, max_lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
        with self._lock:
            lines = list(self._lines) + ([self._pending] if self._pending else [])
        lines = lines[-max_lines:]
        while lines and len("\n".join(lines).encode()) > max_bytes:
            lines.pop(0)
        return "\n".join(lines)


class RotatingFile:
    """Append-only file that moves itself to PATH.1 (replacing the older one) at MAX_BYTES."""

    def __init__(self, path: Path, max_bytes: int = 10 * 1024 * 1024) -> None:
        self.path = path
        self.max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self._size = path.stat().st_size

    def write(self, data: bytes) -> None:
        if self._size + len(data) > self.max_bytes and self._size > 0:
            self._file.close()
            self.path.replace(self.path.with_name(self.path.name + ".1"))
            self._file = self.path.open("ab")
            self._size = 0
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def close(self) -> None:
        self._file.close()


class OutputPump:
    """Copies the child's merged stdout/stderr to the log file, our stdout and the tail, with
    the job's secret values masked in all three when MASK holds any."""

    def __init__(
        self,
        source: BinaryIO,
        logfile: RotatingFile,
        tail: LogTail,
        mask: SecretMask | None = None,
    ) -> None:
        self._source = source
        self._logfile = logfile
        self._tail = tail
        self._masking = mask.stream() if mask else None
        self._echo = getattr(sys.stdout, "buffer", None)
        self._thread = threading.Thread(target=self._run, name="output-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = self._source.read1(64 * 1024)  # type: ignore[attr-defined]
            if not data:
                break
            self._emit(data, decoder.decode(data))
        self._emit(b"", decoder.decode(b"", final=True), final=True)
        self._logfile.close()

    def _emit(self, data: bytes, text: str, *, final: bool = False) -> None:
        if self._masking is not None:
            # Masked text replaces the raw bytes everywhere (undecodable bytes become U+FFFD).
            text = self._masking.feed(text) + (self._masking.flush() if final else "")
            data = text.encode()
        if data:
            self._logfile.write(data)
            self._echo_out(data)
        self._tail.feed(text)

    def _echo_out(self, data: bytes) -> None:
        if self._echo is None:
            return
        try:
            self._echo.write(data)
            self._echo.flush()
        except (OSError, ValueError):
            self._echo = None  # our stdout went away; the log file still has everything


class TailHandler(logging.Handler):
    """Puts the agent's own messages into the tail too, marked, so the portal shows them."""

    def __init__(self, tail: LogTail) -> None:
        super().__init__(level=logging.INFO)
        self._tail = tail

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._tail.add_line(f"[nomad-agent] {record.getMessage()}")
        except Exception:
            self.handleError(record)
