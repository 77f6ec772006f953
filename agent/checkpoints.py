"""Checkpoint directories <-> one object in storage: find, pack, upload, download, unpack.

The object is an uncompressed tar of the directory (optionally ngck1-encrypted, see
ckptcrypto.py). Its exact size is computed from the file list before anything is read, because
the supervisor hands out upload URLs by size. Packing is a generator that can be run again and
yields the same bytes, so a failed single PUT is retried by packing again rather than by keeping
a copy on disk; multipart uploads hold at most ``PARTS_IN_FLIGHT`` + 1 parts in memory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import threading
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
        expired = response.status_code in (401, 403)
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


def _extract_object(raw: BinaryIO, dest: Path, data_key: bytes | None) -> None:
    if data_key is None:
        source, damaged = raw, ()
    else:
        from agent import ckptcrypto

        source = ckptcrypto.DecryptingReader(raw, data_key)  # type: ignore[assignment]
        damaged = (ckptcrypto.CheckpointDecryptError,)
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            extract_safely(tar, dest)
    except damaged as exc:
        raise RestoreError(f"cannot decrypt the checkpoint: {exc}") from exc
    except tarfile.TarError as exc:
        raise RestoreError(f"the checkpoint is not a valid tar: {exc}") from exc


def extract_safely(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract only directories and regular files, each strictly inside DEST.

    Our own packer writes nothing else; anything else (links, devices, absolute or '..' names)
    means a damaged or hostile archive. Works on any Python 3.9+ (no tarfile filters needed).
    """
    root = dest.resolve()
    for member in tar:
        path = _member_path(root, member.name)
        if path is None:
            continue  # "." itself
        if member.isdir():
            path.mkdir(parents=True, exist_ok=True)
        elif member.isreg():
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
        else:
            raise UnsafeArchive(f"{member.name!r}: only files and directories are allowed")


def _member_path(root: Path, name: str) -> Path | None:
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
