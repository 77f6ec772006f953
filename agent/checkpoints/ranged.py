"""How a stored object's bytes come back: parallel ranged GETs into a scratch file, read in
order as they arrive (download.py unpacks or decrypts what the reader hands out).

A restore fetches the object over DOWNLOAD_CONNECTIONS connections at once, each GETting
RANGE_BLOCK-sized byte ranges of the one presigned URL (``Range`` is not part of an S3
signature) in order, into their place in the scratch file: one TCP stream from a far bucket
gets a fraction of a host's link (bench/restore.py). A follower reads the contiguous prefix
that has arrived, hashes it and feeds it to the unpacker, so unpacking ends moments after the
last byte. Storage that ignores ``Range`` (a 200 to the first ranged GET, e.g. the local
store) is read from that one response; objects under RANGED_MIN_SIZE take one plain GET.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from agent.checkpoints.errors import DownloadError
from agent.checkpoints.transfer import READ_CHUNK, ByteCounter

log = logging.getLogger("agent.checkpoints")

DOWNLOAD_CONNECTIONS = 4
RANGE_BLOCK = 16 * 1024 * 1024
MIN_RANGE_BLOCK = 1024 * 1024
RANGED_MIN_SIZE = 8 * 1024 * 1024
RANGE_RETRIES = 4  # tries of one range; the restore phase then retries it all (Downloads)
RANGE_RETRY_BASE_S = 0.5  # waits 0.5, 1, 2 s
FOLLOW_CHUNK = 8 * 1024 * 1024  # the most the follower reads (and hashes) at once


class _Transient(Exception):
    """A range ended early or storage answered 5xx: that range is tried again."""


class FetchFailed(Exception):
    """Raised in the follower when the fetch failed; the fetch's own error says why."""


class RangedFetch:
    """The object's bytes into a scratch file over up to CONNECTIONS ranged GETs, with the
    length of the contiguous prefix written so far (``wait_for``) for the follower."""

    def __init__(
        self,
        storage: httpx.Client,
        url: str,
        size: int,
        path: Path,
        counter: ByteCounter,
        connections: int,
        block_size: int | None,
    ) -> None:
        self._storage, self._url, self.size, self._path = storage, url, size, path
        self._counter = counter
        self._ranged = connections > 1 and size >= RANGED_MIN_SIZE
        if block_size is None:
            block_size = max(MIN_RANGE_BLOCK, min(RANGE_BLOCK, -(-size // (connections * 4))))
        self._connections = connections
        self._blocks = [(a, min(a + block_size, size)) for a in range(0, size, block_size)]
        if not self._ranged or not self._blocks:
            self._blocks = [(0, size)]
        self._filled = [0] * len(self._blocks)
        self._cond = threading.Condition()
        self._next = 0  # the next block a connection takes
        self._first = 0  # the first block not yet complete
        self._prefix = 0  # bytes from offset 0 that are all written
        self._running = 0
        self._done = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connections_used = 1
        self.finished_at = 0.0
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    # -- the follower's side --

    def wait_for(self, offset: int) -> int:
        """The contiguous prefix's length once it reaches OFFSET; FetchFailed if it never will."""
        with self._cond:
            while self._prefix < offset:
                if self._error is not None or self._done:
                    raise FetchFailed()
                self._cond.wait()
            return self._prefix

    def finish(self) -> None:
        """Wait for every connection; raise what failed (DownloadError, OSError)."""
        self._join()
        error = self._error
        if error is None and self._prefix != self.size:
            error = DownloadError(f"downloaded {self._prefix} bytes, expected {self.size}")
        if error is None:
            return
        if isinstance(error, httpx.HTTPError):
            raise DownloadError(f"download failed: {type(error).__name__}: {error}") from error
        if isinstance(error, _Transient):
            raise DownloadError(f"download failed: {error}") from error
        raise error

    def close(self) -> None:
        self._stop.set()
        self._join()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self._path.unlink(missing_ok=True)

    # -- the connections --

    def start(self) -> None:
        self._spawn(self._lead)

    def _spawn(self, work: Callable[[], None]) -> None:
        with self._cond:
            self._running += 1
        thread = threading.Thread(target=self._run, args=(work,), name="restore-fetch")
        self._threads.append(thread)
        thread.start()

    def _join(self) -> None:
        joined = 0
        while joined < len(self._threads):  # the lead adds the others before it ends
            self._threads[joined].join()
            joined += 1

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._stop.set()
                self._cond.notify_all()
        finally:
            with self._cond:
                self._running -= 1
                if self._running == 0:
                    self._done = True
                    self.finished_at = time.monotonic()
                    self._cond.notify_all()

    def _lead(self) -> None:
        self._next = 1
        if not self._ranged:
            self._consume(0, self._get(None), 0)
            return
        response = self._get(self._blocks[0])
        if response.status_code == 200:  # storage ignores Range: this body is the whole object
            log.info("storage ignores Range requests; downloading over one connection")
            with self._cond:
                self._blocks, self._filled, self._ranged = [(0, self.size)], [0], False
            self._consume(0, response, 0)
            return
        self.connections_used = min(self._connections, len(self._blocks))
        for _ in range(self.connections_used - 1):
            self._spawn(self._work)
        self._fetch_block(0, response)
        self._work()

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if self._next >= len(self._blocks):
                    return
                index, self._next = self._next, self._next + 1
            self._fetch_block(index, None)

    def _fetch_block(self, index: int, response: httpx.Response | None) -> None:
        start, end = self._blocks[index]
        for attempt in range(RANGE_RETRIES):
            pos = start + self._filled[index]  # only this thread writes this block
            try:
                if response is None:
                    response = self._get((pos, end))
                    if response.status_code != 206:
                        response.close()
                        raise DownloadError(f"a ranged GET answered {response.status_code}")
                self._consume(index, response, pos)
                return
            except (httpx.TransportError, _Transient) as exc:
                if attempt == RANGE_RETRIES - 1:
                    raise
                log.warning("bytes %d-%d failed (%s); retrying", pos, end - 1, exc)
                if self._stop.wait(RANGE_RETRY_BASE_S * 2**attempt):
                    return
            finally:
                response = None

    def _get(self, span: tuple[int, int] | None) -> httpx.Response:
        """Send the GET (of bytes SPAN, end exclusive); a 200 or a checked 206, else an error."""
        headers = {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}
        request = self._storage.build_request("GET", self._url, headers=headers)
        response = self._storage.send(request, stream=True)
        status = response.status_code
        if status == 206 and span is not None:
            expected = f"bytes {span[0]}-{span[1] - 1}/{self.size}"
            got = response.headers.get("Content-Range", "")
            if got.replace(" ", "") != expected.replace(" ", ""):
                response.close()
                raise DownloadError(f"asked for {expected}, storage sent Content-Range {got!r}")
            return response
        if status == 200:
            return response
        response.read()
        response.close()
        message = f"GET answered {status}: {response.text[:300]}"
        if status >= 500 or status == 429:
            raise _Transient(message)
        raise DownloadError(message)

    def _consume(self, index: int, response: httpx.Response, pos: int) -> None:
        """Write RESPONSE's body from POS on, up to the end of block INDEX."""
        end = self._blocks[index][1]
        try:
            # As the transport hands them over (~64 KB): a chunk size would buffer, and lose
            # what it buffered when the connection drops.
            for piece in response.iter_bytes():
                if self._stop.is_set():
                    return
                if len(piece) > end - pos:
                    raise DownloadError(f"storage sent more than the {self.size} bytes expected")
                view = memoryview(piece)
                while view:
                    written = os.pwrite(self.fd, view, pos)
                    pos += written
                    view = view[written:]
                self._counter.add(down=len(piece))
                self._advance(index, len(piece))
        finally:
            response.close()
        if pos < end:
            if not self._ranged:
                raise DownloadError(f"downloaded {pos} bytes, expected {self.size}")
            raise _Transient(f"the response ended at byte {pos} of {end}")

    def _advance(self, index: int, count: int) -> None:
        with self._cond:
            self._filled[index] += count
            blocks = self._blocks
            while self._first < len(blocks) and self._filled[self._first] == (
                blocks[self._first][1] - blocks[self._first][0]
            ):
                self._first += 1
            if self._first == len(blocks):
                prefix = self.size
            else:
                prefix = blocks[self._first][0] + self._filled[self._first]
            if prefix != self._prefix:
                self._prefix = prefix
                self._cond.notify_all()


class PrefixReader:
    """A read-only file object over the fetch's bytes in order, blocking until they arrive;
    it hashes every byte it hands out (and those ``drain`` skips)."""

    def __init__(self, fetch: RangedFetch) -> None:
        self._fetch = fetch
        self._digest = hashlib.sha256()
        self._end = 0  # file offset just past what was read from the file (and hashed)
        self._buf = b""
        self._off = 0  # how much of _buf was handed out

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        left = self._fetch.size - self._end + len(self._buf) - self._off
        want = left if size is None or size < 0 else min(size, left)
        parts = []
        while want > 0:
            if self._off == len(self._buf):
                self._refill(want)
            take = min(want, len(self._buf) - self._off)
            parts.append(self._buf[self._off : self._off + take])
            self._off += take
            want -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def drain(self) -> None:
        self._buf, self._off = b"", 0
        while self._end < self._fetch.size:
            self._refill(self._fetch.size - self._end)
            self._buf, self._off = b"", 0

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def _refill(self, want: int) -> None:
        have = self._fetch.wait_for(self._end + 1)
        length = min(have - self._end, max(want, READ_CHUNK), FOLLOW_CHUNK)
        data = os.pread(self._fetch.fd, length, self._end)
        if len(data) != length:  # a regular file returns short reads only past its end
            raise DownloadError("the scratch file is shorter than what was written to it")
        self._digest.update(data)
        self._end += length
        self._buf, self._off = data, 0
