"""Secret values out of everything the agent sends or prints: the log tail, the log file, the
echo on its stdout, its own log lines and exit errors (PROTOCOL.md §5, "Secrets").

Each value of ``MIN_LENGTH`` characters or more is replaced by ``***``; shorter ones would mask
ordinary words and numbers. The command's output arrives in chunks of whatever size the pipe
gives, so a value can be split across two reads: ``MaskingStream`` holds back a chunk's tail
while it could still be the start of a secret, and lets it go once the next chunk decides.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

MASK = "***"
MIN_LENGTH = 4


class SecretMask:
    """The secret values to hide, set once register has answered (empty until then)."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self.set(values)

    def set(self, values: Iterable[str]) -> None:
        """Hide VALUES from now on (those shorter than MIN_LENGTH are left as they are)."""
        # Longest first: where two values overlap, the regex takes the longer one.
        kept = tuple(sorted({v for v in values if len(v) >= MIN_LENGTH}, key=len, reverse=True))
        pattern = re.compile("|".join(map(re.escape, kept))) if kept else None
        with self._lock:
            self._state = (kept, pattern)

    def state(self) -> tuple[tuple[str, ...], re.Pattern[str] | None]:
        """The values and their pattern (one consistent pair, for a caller that needs both)."""
        with self._lock:
            return self._state

    def __bool__(self) -> bool:
        return bool(self.state()[0])

    def apply(self, text: str) -> str:
        """TEXT with every secret value replaced by ``***``."""
        pattern = self.state()[1]
        return text if pattern is None else pattern.sub(MASK, text)

    def stream(self) -> MaskingStream:
        """A masker for one stream of text that may split a value between chunks."""
        return MaskingStream(self)


class MaskingStream:
    def __init__(self, mask: SecretMask) -> None:
        self._mask = mask
        self._held = ""

    def feed(self, text: str) -> str:
        """TEXT (after what was held back) masked, minus a tail that could begin a secret."""
        values, pattern = self._mask.state()
        buf = self._held + text
        if pattern is None:
            self._held = ""
            return buf
        cut = len(buf) - _partial_suffix(buf, values)
        out, pos = [], 0
        for match in pattern.finditer(buf):
            if match.end() > cut:  # it might be the start of a longer value: decide later
                cut = match.start()
                break
            out += [buf[pos : match.start()], MASK]
            pos = match.end()
        out.append(buf[pos:cut])
        self._held = buf[cut:]
        return "".join(out)

    def flush(self) -> str:
        """What was held back, masked: the stream has ended."""
        held, self._held = self._held, ""
        return self._mask.apply(held)


def _partial_suffix(text: str, values: Iterable[str]) -> int:
    """The length of the longest end of TEXT that is the beginning (not all) of a value."""
    longest = 0
    for value in values:
        start = max(0, len(text) - len(value) + 1)
        at = text.find(value[0], start)
        while at != -1:
            if value.startswith(text[at:]):
                longest = max(longest, len(text) - at)
                break  # the first hit is the longest for this value
            at = text.find(value[0], at + 1)
    return longest


class MaskFilter(logging.Filter):
    """Masks a record's message (and traceback) in place, so every handler after it, the
    container's stderr and the log tail alike, sees only the masked text."""

    def __init__(self, mask: SecretMask) -> None:
        super().__init__()
        self.mask = mask

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.mask:
            return True
        record.msg, record.args = self.mask.apply(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask.apply(record.exc_text)
        if record.stack_info:
            record.stack_info = self.mask.apply(record.stack_info)
        return True


def install(mask: SecretMask, logger: logging.Logger | None = None) -> None:
    """Put a MaskFilter on every handler of LOGGER (the root logger): handler filters see the
    records that propagate up from the agent's loggers, a logger's own filters do not."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, MaskFilter) and f.mask is mask for f in handler.filters):
            handler.addFilter(MaskFilter(mask))
