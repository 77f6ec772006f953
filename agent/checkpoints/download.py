"""How a stored object comes back onto this disk: ``restore`` into a folder (a checkpoint, the
job's code pack), ``fetch_file`` into one file (a staged model file), each unpacked or decrypted
while ranged.py downloads it; and the old sequential path, ``download_verified`` then
``unpack``, that bench/restore.py and bench/upload.py compare against.

Named download.py, not restore.py: this package re-exports the function ``restore``, and a
module of that name would be shadowed by it (``agent.checkpoints.restore`` is the function).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.checkpoints.archives import CHECKPOINT, ArchiveFormat, extract_object
from agent.checkpoints.errors import DownloadError, RestoreError
from agent.checkpoints.ranged import DOWNLOAD_CONNECTIONS, FetchFailed, PrefixReader, RangedFetch
from agent.checkpoints.transfer import READ_CHUNK, ByteCounter


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
    fetch = RangedFetch(storage, obj["url"], size, scratch, counter, connections, block_size)
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        fetch.start()
        reader = PrefixReader(fetch)
        unpack_error: Exception | None = None
        try:
            extract_object(reader, partial, data_key, archive)  # type: ignore[arg-type]
        except FetchFailed:
            pass  # fetch.finish() raises why
        except Exception as exc:  # judged once the sha256 says whether the bytes were intact
            unpack_error = exc
        with contextlib.suppress(FetchFailed):
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
    fetch = RangedFetch(storage, obj["url"], int(obj["size"]), scratch, counter, connections, None)
    try:
        fetch.start()
        reader = PrefixReader(fetch)
        damaged = _decrypt_into(reader, partial, data_key) if data_key is not None else None
        with contextlib.suppress(FetchFailed):
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


def _decrypt_into(reader: PrefixReader, out: Path, data_key: bytes) -> Exception | None:
    """Decrypt what READER hands out into OUT; the decryption error, judged once the sha256
    says whether the bytes were intact (None when it all decrypted, or the fetch failed)."""
    from agent import ckptcrypto

    try:
        with out.open("wb") as dst:
            ckptcrypto.decrypt_stream(reader, dst, data_key)  # type: ignore[arg-type]
    except FetchFailed:
        return None
    except ckptcrypto.CheckpointDecryptError as exc:
        return exc
    return None


# --- the old sequential path: one GET, then the file is read back and unpacked -----------


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
            extract_object(raw, partial, data_key)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
