"""Checkpoint directories <-> one object in storage: find, pack, upload, download, unpack.

The object is an uncompressed tar of the directory (optionally ngck1-encrypted, see
ckptcrypto.py). Its exact size is computed from the file list before anything is read, because
the supervisor hands out upload URLs by size. Packing is a generator that can be run again and
yields the same bytes, so a failed single PUT is retried by packing again rather than by keeping
a copy on disk; multipart uploads hold at most ``PARTS_IN_FLIGHT`` + 1 parts in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tarfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import httpx

from agent import READY_MARKER, UPLOADED_MARKER

log = logging.getLogger("agent.checkpoints")

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240
READ_CHUNK = 1024 * 1024
PART_RETRIES = 4
RETRY_BASE_S = 1.0  # storage retries wait 1, 2, 4 s
# Parts PUT at once while the next one is packed. One at a time, packing and every part's
# round trip took turns and an upload ran at 0.66 of boto3's upload_file (bench/upload.py);
# each part in flight holds its bytes (64 MB) in memory.
PARTS_IN_FLIGHT = 3
# Files the protocol itself puts in a checkpoint directory; never part of the checkpoint.
PROTOCOL_FILES = {READY_MARKER, UPLOADED_MARKER}


class CheckpointChanged(Exception):
    """A file changed, appeared or vanished while its checkpoint was being packed."""


class UnsafeArchive(Exception):
    """A tar member would land outside the target directory or is not a plain file/directory."""


class StorageError(Exception):
    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired  # the presigned URL is no longer accepted: ask for new ones


class Cancelled(Exception):
    """The agent is shutting down (token dead); abandon the transfer."""


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


# --- finding ready checkpoints ---------------------------------------------------------------


@dataclass(frozen=True)
class ReadyCheckpoint:
    path: Path
    step: int


def find_ready(
    checkpoint_dir: Path, *, on_bad_marker: Callable[[Path, str], None]
) -> list[ReadyCheckpoint]:
    """Sub-directories holding NOMAD_READY and not yet NOMAD_UPLOADED, oldest step first."""
    found = []
    try:
        children = list(os.scandir(checkpoint_dir))
    except FileNotFoundError:
        return []
    for entry in children:
        if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
            continue
        path = Path(entry.path)
        marker = path / READY_MARKER
        if not marker.is_file() or (path / UPLOADED_MARKER).exists():
            continue
        text = marker.read_text(errors="replace").strip()
        try:
            found.append(ReadyCheckpoint(path, int(text)))
        except ValueError:
            on_bad_marker(marker, text)
    return sorted(found, key=lambda ready: (ready.step, ready.path.name))


def local_copy(
    checkpoint_dir: Path, checkpoint_id: Any, step: int, *, sha256: str | None = None
) -> Path | None:
    """A directory on this disk that already holds checkpoint CHECKPOINT_ID (at STEP): the one
    the training script wrote and this agent uploaded (its NOMAD_UPLOADED holds the id), or a
    restore this container finished earlier (``mark_restored``). There is one after the
    host rebooted and the container restarted on the same disk (Vast keeps it); None on a new
    host, or when the script has deleted it since. A ready directory of that step whose
    marker was never written (the reboot came between the supervisor's answer and the marker)
    counts when it packs to SHA256, the object's digest (given for an unencrypted object only:
    packing is deterministic, encrypting is not)."""
    wanted = str(checkpoint_id)
    restored = checkpoint_dir / f"resume-{step}"
    if _marker_text(_restored_marker(restored)) == wanted and restored.is_dir():
        return restored
    try:
        children = list(os.scandir(checkpoint_dir))
    except FileNotFoundError:
        return None
    for entry in children:
        path = Path(entry.path)
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if _marker_text(path / READY_MARKER) != str(step):
            continue
        uploaded = _marker_text(path / UPLOADED_MARKER)
        if uploaded == wanted or (uploaded is None and sha256 and _packs_to(path, sha256)):
            return path
    return None


def _packs_to(directory: Path, sha256: str) -> bool:
    """Whether DIRECTORY packs to the object whose digest is SHA256 (read from disk only)."""
    digest = hashlib.sha256()
    try:
        for piece in object_pieces(plan_tar(directory), None):
            digest.update(piece)
    except (CheckpointChanged, OSError):
        return False
    return digest.hexdigest() == sha256


def mark_restored(target: Path, checkpoint_id: Any) -> None:
    """Note beside TARGET that it holds checkpoint CHECKPOINT_ID, complete (written after the
    unpack, so a restore cut short by a reboot is never taken for a copy)."""
    _restored_marker(target).write_text(f"{checkpoint_id}\n")


def _restored_marker(target: Path) -> Path:
    # Beside the directory, not in it: the training script reads the directory as its own.
    return target.parent / f".{target.name}.restored"


def _marker_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def mark_uploaded(ready: ReadyCheckpoint, checkpoint_id: str) -> None:
    # Tells the training script the directory may go, and a restarted agent to skip it.
    (ready.path / UPLOADED_MARKER).write_text(f"{checkpoint_id}\n")


# --- packing ---------------------------------------------------------------------------------


@dataclass
class TarPlan:
    members: list[tuple[tarfile.TarInfo, Path | None]]
    size: int


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padded(size: int, unit: int = BLOCK) -> int:
    return -(-size // unit) * unit


def plan_tar(directory: Path) -> TarPlan:
    """Members (directories and regular files, sorted) and the exact tar size, from stat only."""
    members: list[tuple[tarfile.TarInfo, Path | None]] = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        rel_root = Path(root).relative_to(directory)
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                log.warning("not packing symlink %s/%s", root, name)
                continue
            members.append((_info(rel_root / name, Path(root, name), tarfile.DIRTYPE), None))
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(root, name))]
        for name in sorted(files):
            path = Path(root, name)
            if rel_root == Path(".") and (name in PROTOCOL_FILES or name.startswith(".nomad-")):
                continue
            if path.is_symlink() or not path.is_file():
                log.warning("not packing %s: not a regular file", path)
                continue
            members.append((_info(rel_root / name, path, tarfile.REGTYPE), path))
    size = sum(len(_header(info)) + _padded(info.size) for info, _ in members)
    return TarPlan(members, _padded(size + 2 * BLOCK, RECORD))


def _info(name: Path, path: Path, kind: bytes) -> tarfile.TarInfo:
    st = path.stat()
    info = tarfile.TarInfo(name.as_posix())
    info.type = kind
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.mode = (st.st_mode & 0o755) | (0o700 if kind == tarfile.DIRTYPE else 0o600)
    info.mtime = int(st.st_mtime)
    return info


def tar_pieces(plan: TarPlan) -> Iterator[bytes]:
    """The tar's bytes, streamed from disk; exactly plan.size bytes or CheckpointChanged."""
    written = 0
    for info, path in plan.members:
        header = _header(info)
        yield header
        written += len(header)
        if path is not None:
            yield from _file_pieces(path, info.size)
            padding = _padded(info.size) - info.size
            if padding:
                yield bytes(padding)
            written += _padded(info.size)
    yield bytes(plan.size - written)  # end-of-archive blocks and record padding


def _file_pieces(path: Path, size: int) -> Iterator[bytes]:
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise CheckpointChanged(f"{path} vanished while packing") from None
    with f:
        left = size
        while left:
            piece = f.read(min(READ_CHUNK, left))
            if not piece:
                raise CheckpointChanged(f"{path} shrank while packing")
            left -= len(piece)
            yield piece
        if os.fstat(f.fileno()).st_size != size:
            raise CheckpointChanged(f"{path} changed size while packing")


def object_size(plan: TarPlan, encrypted: bool) -> int:
    if not encrypted:
        return plan.size
    from agent import ckptcrypto  # lazily: only encrypted jobs need `cryptography`

    return ckptcrypto.encrypted_size(plan.size)


def object_pieces(plan: TarPlan, crypt: dict[str, Any] | None) -> Iterator[bytes]:
    """The object to upload: the tar, or the tar through ngck1 with CRYPT's key/salt/prefix.

    Running it twice with the same CRYPT yields the same bytes (needed to retry a PUT).
    """
    if crypt is None:
        yield from tar_pieces(plan)
        return
    from agent import ckptcrypto

    sink = _Collector()
    writer = ckptcrypto.EncryptingWriter(
        sink, crypt["key"], salt=crypt["salt"], nonce_prefix=crypt["prefix"]
    )
    for piece in tar_pieces(plan):
        writer.write(piece)
        yield from sink.drain()
    writer.close()
    yield from sink.drain()


class _Collector:
    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write(self, data: bytes | memoryview) -> int:
        self.pieces.append(bytes(data))  # copy: the writer reuses its buffer
        return len(data)

    def drain(self) -> Iterator[bytes]:
        pieces, self.pieces = self.pieces, []
        return iter(pieces)


def new_crypt(data_key: bytes) -> dict[str, Any]:
    return {"key": data_key, "salt": os.urandom(32), "prefix": os.urandom(7)}


# --- uploading -------------------------------------------------------------------------------


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


# --- downloading and unpacking ---------------------------------------------------------------


class RestoreError(Exception):
    """The checkpoint to resume from could not be fetched, verified or unpacked."""


def download_verified(
    storage: httpx.Client, obj: dict[str, Any], dest: Path, *, counter: ByteCounter
) -> None:
    """GET the presigned object into DEST, checking its size and sha256 on the way."""
    digest = hashlib.sha256()
    got = 0
    try:
        with storage.stream("GET", obj["url"]) as response, dest.open("wb") as out:
            if response.status_code != 200:
                response.read()
                raise RestoreError(f"GET answered {response.status_code}: {response.text[:300]}")
            for piece in response.iter_bytes(READ_CHUNK):
                digest.update(piece)
                out.write(piece)
                got += len(piece)
                counter.add(down=len(piece))
    except httpx.HTTPError as exc:
        raise RestoreError(f"download failed: {type(exc).__name__}: {exc}") from exc
    if got != int(obj["size"]):
        raise RestoreError(f"downloaded {got} bytes, expected {obj['size']}")
    if digest.hexdigest() != obj["sha256"]:
        raise RestoreError("the downloaded checkpoint's sha256 does not match")


def unpack(archive: Path, target: Path, *, data_key: bytes | None) -> None:
    """Unpack ARCHIVE (decrypting when DATA_KEY is given) into a fresh TARGET directory."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with archive.open("rb") as raw:
            _extract_object(raw, partial, data_key)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


# A restore fetches the object over DOWNLOAD_CONNECTIONS connections at once, each GETting
# RANGE_BLOCK-sized byte ranges of the one presigned URL (``Range`` is not part of an S3
# signature) in order, into their place in the scratch file: one TCP stream from a far bucket
# gets a fraction of a host's link (bench/restore.py). A follower reads the contiguous prefix
# that has arrived, hashes it and feeds it to the unpacker, so unpacking ends moments after the
# last byte. Storage that ignores ``Range`` (a 200 to the first ranged GET, e.g. the local
# store) is read from that one response; objects under RANGED_MIN_SIZE take one plain GET.
DOWNLOAD_CONNECTIONS = 4
RANGE_BLOCK = 16 * 1024 * 1024
MIN_RANGE_BLOCK = 1024 * 1024
RANGED_MIN_SIZE = 8 * 1024 * 1024
RANGE_RETRIES = 4  # tries of one range; the runner then retries the whole restore
RANGE_RETRY_BASE_S = 0.5  # waits 0.5, 1, 2 s
FOLLOW_CHUNK = 8 * 1024 * 1024  # the most the follower reads (and hashes) at once


class DownloadError(RestoreError):
    """Fetching or verifying the object failed; fetching it again may succeed."""


class _Transient(Exception):
    """A range ended early or storage answered 5xx: that range is tried again."""


class _FetchFailed(Exception):
    """Raised in the follower when the fetch failed; the fetch's own error says why."""


@dataclass
class RestoreStats:
    size: int
    connections: int  # 1: one plain GET (small object, or storage without Range support)
    download_s: float  # until the last byte was written
    total_s: float  # until verified and unpacked


def restore(
    storage: httpx.Client,
    obj: dict[str, Any],
    target: Path,
    *,
    scratch: Path,
    data_key: bytes | None,
    counter: ByteCounter,
    connections: int = DOWNLOAD_CONNECTIONS,
    block_size: int | None = None,
    archive: ArchiveFormat | None = None,
) -> RestoreStats:
    """Fetch the presigned OBJ into SCRATCH and unpack it into a fresh TARGET as it arrives.

    ARCHIVE says how to unpack it: a checkpoint's plain tar by default; the job's code pack
    (a .tar.gz that may hold links, agent/workdir.py) comes the same way.

    Nothing is in TARGET until the whole object arrived, matched OBJ's size and sha256 and
    unpacked (into TARGET.partial meanwhile; extraction is confined to it, see extract_safely).
    DownloadError: fetching or the size/sha256 check failed, worth another try; RestoreError or
    UnsafeArchive from unpacking only if the bytes were verified (the same ones would fail again).
    SCRATCH is removed either way.
    """
    t0 = time.monotonic()
    archive = archive or CHECKPOINT
    size = int(obj["size"])
    partial = target.with_name(target.name + ".partial")
    fetch = _Fetch(storage, obj["url"], size, scratch, counter, connections, block_size)
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        fetch.start()
        reader = _PrefixReader(fetch)
        unpack_error: Exception | None = None
        try:
            _extract_object(reader, partial, data_key, archive)  # type: ignore[arg-type]
        except _FetchFailed:
            pass  # fetch.finish() raises why
        except Exception as exc:  # judged once the sha256 says whether the bytes were intact
            unpack_error = exc
        with contextlib.suppress(_FetchFailed):
            reader.drain()  # the bytes the tar reader never asked for count too
        fetch.finish()
        if reader.hexdigest() != obj["sha256"]:
            raise DownloadError(f"the downloaded {archive.what}'s sha256 does not match")
        if unpack_error is not None:
            raise unpack_error
    except BaseException:
        fetch.close()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    fetch.close()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return RestoreStats(size, fetch.connections_used, fetch.finished_at - t0, time.monotonic() - t0)


def fetch_file(
    storage: httpx.Client,
    obj: dict[str, Any],
    dest: Path,
    *,
    scratch: Path,
    data_key: bytes | None,
    counter: ByteCounter,
    connections: int = DOWNLOAD_CONNECTIONS,
) -> RestoreStats:
    """Fetch the presigned OBJ as ``restore`` does (parallel ranged GETs, sha256 and size
    checked) into the plain file DEST: the scratch file itself when OBJ is not encrypted, else
    its ngck1 plaintext (DATA_KEY), decrypted as the bytes arrive. Nothing is at DEST unless
    it all checked out. DownloadError as ``restore``; RestoreError for bytes that verified but
    do not decrypt."""
    t0 = time.monotonic()
    partial = dest.with_name(dest.name + ".partial")
    fetch = _Fetch(storage, obj["url"], int(obj["size"]), scratch, counter, connections, None)
    try:
        fetch.start()
        reader = _PrefixReader(fetch)
        damaged = _decrypt_into(reader, partial, data_key) if data_key is not None else None
        with contextlib.suppress(_FetchFailed):
            reader.drain()
        fetch.finish()
        if reader.hexdigest() != obj["sha256"]:
            raise DownloadError(f"the downloaded {dest.name}'s sha256 does not match")
        if damaged is not None:
            raise RestoreError(f"cannot decrypt {dest.name}: {damaged}")
        os.replace(scratch if data_key is None else partial, dest)
    except BaseException:
        fetch.close()
        partial.unlink(missing_ok=True)
        raise
    fetch.close()
    return RestoreStats(
        fetch.size, fetch.connections_used, fetch.finished_at - t0, time.monotonic() - t0
    )


def _decrypt_into(reader: _PrefixReader, out: Path, data_key: bytes) -> Exception | None:
    """Decrypt what READER hands out into OUT; the decryption error, judged once the sha256
    says whether the bytes were intact (None when it all decrypted, or the fetch failed)."""
    from agent import ckptcrypto

    try:
        with out.open("wb") as dst:
            ckptcrypto.decrypt_stream(reader, dst, data_key)  # type: ignore[arg-type]
    except _FetchFailed:
        return None
    except ckptcrypto.CheckpointDecryptError as exc:
        return exc
    return None


class _Fetch:
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
        """The contiguous prefix's length once it reaches OFFSET; _FetchFailed if it never will."""
        with self._cond:
            while self._prefix < offset:
                if self._error is not None or self._done:
                    raise _FetchFailed()
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


class _PrefixReader:
    """A read-only file object over the fetch's bytes in order, blocking until they arrive;
    it hashes every byte it hands out (and those ``drain`` skips)."""

    def __init__(self, fetch: _Fetch) -> None:
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


def _extract_object(
    raw: BinaryIO, dest: Path, data_key: bytes | None, archive: ArchiveFormat | None = None
) -> None:
    archive = archive or CHECKPOINT
    damaged: tuple[type[Exception], ...] = ()
    if data_key is not None:
        from agent import ckptcrypto

        damaged = (ckptcrypto.CheckpointDecryptError,)
    try:
        source = raw if data_key is None else ckptcrypto.DecryptingReader(raw, data_key)
        with tarfile.open(fileobj=source, mode=f"r|{archive.compression}") as tar:
            archive.extract(tar, dest)
    except damaged as exc:
        raise RestoreError(f"cannot decrypt the {archive.what}: {exc}") from exc
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # the last two: a damaged gzip
        raise RestoreError(f"the {archive.what} is not a valid tar: {exc}") from exc


def extract_safely(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract only directories and regular files, each strictly inside DEST.

    Our own packer writes nothing else; anything else (links, devices, absolute or '..' names)
    means a damaged or hostile archive. Works on any Python 3.9+ (no tarfile filters needed).
    """
    root = dest.resolve()
    for member in tar:
        path = member_path(root, member.name)
        if path is None:
            continue  # "." itself
        if not (member.isdir() or member.isreg()):
            raise UnsafeArchive(f"{member.name!r}: only files and directories are allowed")
        extract_member(tar, member, path)


def extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    """Write the directory or regular file MEMBER at PATH (from member_path)."""
    if member.isdir():
        path.mkdir(parents=True, exist_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None
    try:
        out = path.open("xb")  # "x": a repeated name must not overwrite the first
    except FileExistsError:
        raise UnsafeArchive(f"{member.name!r}: appears twice") from None
    with source, out:
        shutil.copyfileobj(source, out, READ_CHUNK)
    path.chmod((member.mode & 0o755) | 0o600)


def member_path(root: Path, name: str) -> Path | None:
    """Where member NAME goes under ROOT (resolved); None for "." itself; UnsafeArchive for an
    absolute or '..' name, or one whose folder already resolves outside ROOT."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or name.startswith(("\\", "/")) or "\\" in name or "\0" in name:
        raise UnsafeArchive(f"{name!r}: absolute or non-POSIX path")
    parts = [part for part in pure.parts if part != "."]
    if any(part == ".." for part in parts):
        raise UnsafeArchive(f"{name!r}: '..' in path")
    if not parts:
        return None
    path = root.joinpath(*parts)
    if os.path.commonpath([root, os.path.realpath(path.parent)]) != str(root):
        raise UnsafeArchive(f"{name!r}: leaves the target directory")
    return path


@dataclass(frozen=True)
class ArchiveFormat:
    """How a restored object's bytes become files: tarfile's stream compression ("" or "gz"),
    the extraction policy, and what to call the object in error messages."""

    what: str
    compression: str = ""
    extract: Callable[[tarfile.TarFile, Path], None] = extract_safely


CHECKPOINT = ArchiveFormat("checkpoint")
