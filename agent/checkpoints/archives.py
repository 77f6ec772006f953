"""How an archive's bytes become files, and only safe ones: the tar stream read (decrypted when
a key is given) and extracted into a folder that nothing may leave.

A checkpoint is extracted by ``extract_safely`` (directories and regular files only); the job's
code pack brings its own policy (``agent.workdir.extract_code``) through ArchiveFormat.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from agent.checkpoints.errors import RestoreError, UnsafeArchive
from agent.checkpoints.transfer import READ_CHUNK


def extract_object(
    raw: BinaryIO, dest: Path, data_key: bytes | None, archive: ArchiveFormat | None = None
) -> None:
    """Read the tar stream RAW (ngck1, decrypted on the way, when DATA_KEY is given) into DEST
    by ARCHIVE's policy (a checkpoint's by default); RestoreError when it does not decrypt or
    is not a tar."""
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
