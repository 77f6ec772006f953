"""How a packed checkpoint reaches storage: one presigned PUT, or parts PUT a few at a time.

Multipart uploads hold at most ``PARTS_IN_FLIGHT`` + 1 parts in memory. A part or a single PUT
that fails is sent again, up to PART_RETRIES times; a URL that storage no longer accepts is not
(StorageError.expired: the uploader asks the supervisor for new ones).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from agent.checkpoints.errors import Cancelled, CheckpointChanged, StorageError
from agent.checkpoints.transfer import ByteCounter

log = logging.getLogger("agent.checkpoints")

PART_RETRIES = 4
RETRY_BASE_S = 1.0  # storage retries wait 1, 2, 4 s
# Parts PUT at once while the next one is packed. One at a time, packing and every part's
# round trip took turns and an upload ran at 0.66 of boto3's upload_file (bench/upload.py);
# each part in flight holds its bytes (64 MB) in memory.
PARTS_IN_FLIGHT = 3


@dataclass
class Uploaded:
    sha256: str
    parts: list[dict[str, Any]] | None


def upload_object(
    storage: httpx.Client,
    target: dict[str, Any],
    size: int,
    pieces: Callable[[], Iterator[bytes]],
    *,
    cancel: threading.Event,
    counter: ByteCounter,
) -> Uploaded:
    """PUT the object to the presigned TARGET (single or multipart); returns its sha256."""
    if target.get("kind") == "multipart":
        return _upload_multipart(storage, target, size, pieces(), cancel=cancel, counter=counter)
    if target.get("kind") != "single":
        raise StorageError(f"unknown upload kind {target.get('kind')!r}")
    last_error: StorageError | None = None
    for attempt in range(PART_RETRIES):
        digest = hashlib.sha256()
        body = _hashed(pieces(), digest, counter, cancel)
        headers = {**target.get("headers", {}), "Content-Length": str(size)}
        try:
            _put(storage, target["url"], body, headers)
            return Uploaded(digest.hexdigest(), None)
        except StorageError as exc:
            if exc.expired or attempt == PART_RETRIES - 1:
                raise
            last_error = exc
            log.warning("upload failed (%s); retrying", exc)
            cancel.wait(RETRY_BASE_S * 2**attempt)
    raise last_error or StorageError("upload failed")


def _hashed(
    pieces: Iterator[bytes], digest: Any, counter: ByteCounter, cancel: threading.Event
) -> Iterator[bytes]:
    for piece in pieces:
        if cancel.is_set():
            raise Cancelled()
        digest.update(piece)
        counter.add(up=len(piece))
        yield piece


def _upload_multipart(
    storage: httpx.Client,
    target: dict[str, Any],
    size: int,
    pieces: Iterator[bytes],
    *,
    cancel: threading.Event,
    counter: ByteCounter,
) -> Uploaded:
    part_size = int(target["part_size"])
    urls = {int(p["part_number"]): p["url"] for p in target["parts"]}
    expected_parts = max(1, -(-size // part_size))
    if sorted(urls) != list(range(1, expected_parts + 1)):
        raise StorageError(f"got part URLs {sorted(urls)} for {expected_parts} parts")
    digest = hashlib.sha256()
    buffer = bytearray()
    with _PartSender(storage, urls, cancel, counter) as sender:
        for piece in pieces:
            digest.update(piece)
            buffer += piece
            while len(buffer) >= part_size and sender.sent + 1 < expected_parts:
                part = bytes(memoryview(buffer)[:part_size])  # one copy; the view is released
                del buffer[:part_size]
                sender.send(part)
        if sender.sent + 1 != expected_parts or len(buffer) > part_size:
            raise CheckpointChanged("the packed size differs from the planned size")
        sender.send(bytes(buffer))
        done = sender.finish()
    return Uploaded(digest.hexdigest(), done)


class _PartSender:
    """PUTs parts numbered 1, 2, ... on threads, at most PARTS_IN_FLIGHT at once; ``send``
    waits for the oldest part when that many are in flight, and raises its error if it failed.
    Leaving the block early cancels the parts not started and waits for the running ones."""

    def __init__(
        self,
        storage: httpx.Client,
        urls: dict[int, str],
        cancel: threading.Event,
        counter: ByteCounter,
    ) -> None:
        self._put = lambda number, body: _put_part(storage, urls, number, body, cancel, counter)
        self._pool = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="part-upload")
        self._in_flight: deque[Future] = deque()
        self._done: list[dict[str, Any]] = []
        self.sent = 0

    def send(self, body: bytes) -> None:
        while len(self._in_flight) >= PARTS_IN_FLIGHT:
            self._done.append(self._in_flight.popleft().result())
        self.sent += 1
        self._in_flight.append(self._pool.submit(self._put, self.sent, body))

    def finish(self) -> list[dict[str, Any]]:
        """Every part's ``{"part_number", "etag"}`` in order, once all are stored."""
        while self._in_flight:
            self._done.append(self._in_flight.popleft().result())
        return self._done

    def __enter__(self) -> _PartSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _put_part(
    storage: httpx.Client,
    urls: dict[int, str],
    number: int,
    body: bytes,
    cancel: threading.Event,
    counter: ByteCounter,
) -> dict[str, Any]:
    for attempt in range(PART_RETRIES):
        if cancel.is_set():
            raise Cancelled()
        try:
            counter.add(up=len(body))  # sent bytes count, whether storage keeps them or not
            response = _put(storage, urls[number], body, {"Content-Length": str(len(body))})
            etag = response.headers.get("ETag")
            if not etag:
                raise StorageError(f"part {number}: storage sent no ETag")
            return {"part_number": number, "etag": etag}
        except StorageError as exc:
            if exc.expired or attempt == PART_RETRIES - 1:
                raise
            log.warning("part %d failed (%s); retrying", number, exc)
            cancel.wait(RETRY_BASE_S * 2**attempt)
    raise AssertionError("unreachable")


def _put(storage: httpx.Client, url: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    # An explicit Content-Length keeps httpx from chunked encoding, which S3 PUTs refuse.
    try:
        response = storage.put(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise StorageError(f"PUT failed: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 300:
        # 401/403: the URL expired; 410: the server refuses writes of an ended attempt. Either
        # way the same URL never works again: ask the supervisor (which fences a dead attempt).
        expired = response.status_code in (401, 403, 410)
        raise StorageError(
            f"PUT answered {response.status_code}: {response.text[:300]}", expired=expired
        )
    return response
