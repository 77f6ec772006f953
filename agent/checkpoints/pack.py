"""What bytes a checkpoint directory becomes: the object format of PROTOCOL.md §3.

The object is an uncompressed tar of the directory (optionally ngck1-encrypted, see
ckptcrypto.py). Its exact size is computed from the file list before anything is read, because
the supervisor hands out upload URLs by size. Packing is a generator that can be run again and
yields the same bytes, so a failed single PUT is retried by packing again rather than by keeping
a copy on disk (upload.py).
"""

from __future__ import annotations

import logging
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import READY_MARKER, UPLOADED_MARKER
from agent.checkpoints.errors import CheckpointChanged
from agent.checkpoints.transfer import READ_CHUNK

log = logging.getLogger("agent.checkpoints")

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240
# Files the protocol itself puts in a checkpoint directory; never part of the checkpoint.
PROTOCOL_FILES = {READY_MARKER, UPLOADED_MARKER}


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
