"""Code archives uploaded through the portal's form, made into packs.

A .tar.gz (.tgz) is checked and kept byte for byte: its sha256 is the pack's name, so the same
file uploaded again is the same pack. A .zip is repacked into a .tar.gz that depends only on
its entries (sorted by name, mtime 0, uid/gid 0, no owner names, a gzip header without name or
time), so the same .zip always gives the same pack too. Both are refused when they are not
readable or hold a member that would land outside the work directory (a path with ``..``, an
absolute path, a link pointing out, a device), the same rule the agent's extraction applies.
"""

from __future__ import annotations

import gzip
import hashlib
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from django.conf import settings

from jobs.code import packs
from nomadgpu.storage import READ_CHUNK

# A .zip's entries may declare at most this many times the cap in all: a zip bomb must not
# keep the web process compressing for minutes before the cap refuses its result.
UNPACKED_FACTOR = 10
SUFFIXES = (".tar.gz", ".tgz", ".zip")
# Where members are checked against; nothing is ever extracted there.
CHECK_ROOT = "/nonexistent-workdir"


class ArchiveRefused(Exception):
    """The upload cannot be a code pack; the message says why, for the form's field."""


@dataclass(frozen=True)
class PreparedPack:
    """A pack ready to store: its bytes in FILE (any position), their sha256 and size."""

    file: BinaryIO
    sha256: str
    size: int


def prepare_archive(name: str, source: BinaryIO) -> PreparedPack:
    """The pack for the uploaded archive NAME (a .tar.gz/.tgz as it is, a .zip repacked).
    Raises ArchiveRefused: another kind of file, unreadable, unsafe, or over the cap."""
    lower = name.lower()
    if lower.endswith((".tar.gz", ".tgz")):
        check_tar_gz(source)
        pack = _hashed(source)
    elif lower.endswith(".zip"):
        pack = _hashed(zip_to_tar_gz(source))
    else:
        raise ArchiveRefused(f"{name!r}: upload a .tar.gz, .tgz or .zip of your code folder")
    if why := packs.size_refusal(pack.size):
        raise ArchiveRefused(why)
    return pack


def _hashed(source: BinaryIO) -> PreparedPack:
    source.seek(0)
    digest, size = hashlib.sha256(), 0
    while chunk := source.read(READ_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return PreparedPack(file=source, sha256=digest.hexdigest(), size=size)


def check_tar_gz(source: BinaryIO) -> None:
    """Refuse (ArchiveRefused) a .tar.gz that is not whole (the gzip stream is read to its
    end, where its checksum is) or holds no file or an unsafe member."""
    try:
        source.seek(0)
        with gzip.GzipFile(fileobj=source, mode="rb") as whole:
            while whole.read(READ_CHUNK):
                pass
        source.seek(0)
        with tarfile.open(fileobj=source, mode="r:gz") as tar:
            members = [check_member(member) for member in tar]
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveRefused(f"this is not a readable .tar.gz ({exc})") from None
    if not any(member.isfile() for member in members):
        raise ArchiveRefused("the archive holds no file")


def check_member(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """MEMBER if extracting it stays inside the work directory, else ArchiveRefused."""
    if member.name.startswith("/"):
        # Python's data filter would strip the slash; an archive that says "/etc" is refused.
        raise ArchiveRefused(f"the archive holds an unsafe member: {member.name!r} is absolute")
    try:
        tarfile.data_filter(member, CHECK_ROOT)
    except tarfile.FilterError as exc:
        raise ArchiveRefused(f"the archive holds an unsafe member: {exc}") from None
    return member


def zip_to_tar_gz(source: BinaryIO) -> BinaryIO:
    """The .zip in SOURCE as a deterministic .tar.gz in a temporary file."""
    try:
        source.seek(0)
        with zipfile.ZipFile(source) as archive:
            entries = _checked_entries(archive)
            return _repacked(archive, entries)
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as exc:
        # RuntimeError: a password-protected entry; NotImplementedError: a compression
        # method Python cannot read.
        raise ArchiveRefused(f"this is not a readable .zip ({exc})") from None


def _checked_entries(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    entries = sorted(archive.infolist(), key=lambda info: info.filename)
    if not any(not info.is_dir() for info in entries):
        raise ArchiveRefused("the archive holds no file")
    declared = sum(info.file_size for info in entries)
    if declared > UNPACKED_FACTOR * packs.max_bytes():
        raise ArchiveRefused(
            f"the archive unpacks to {declared // packs.MB} MB, more than "
            f"{UNPACKED_FACTOR} times the {settings.WORKDIR_MAX_MB} MB limit (WORKDIR_MAX_MB)"
        )
    for info in entries:
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ArchiveRefused(f"{info.filename}: symbolic links in a .zip are not supported")
        check_member(_tar_info(info))
    return entries


def _tar_info(info: zipfile.ZipInfo) -> tarfile.TarInfo:
    """The tar header of zip entry INFO, with nothing that varies between packings."""
    member = tarfile.TarInfo(info.filename.rstrip("/"))
    member.mtime = 0
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    if info.is_dir():
        member.type, member.mode = tarfile.DIRTYPE, 0o755
    else:
        executable = (info.external_attr >> 16) & 0o111
        member.size, member.mode = info.file_size, 0o755 if executable else 0o644
    return member


def _repacked(archive: zipfile.ZipFile, entries: list[zipfile.ZipInfo]) -> BinaryIO:
    out = tempfile.TemporaryFile(dir=settings.VAR_DIR)  # noqa: SIM115 (the caller reads it)
    # mtime=0 and no file name: the gzip header must not vary with when or what was packed.
    with (
        gzip.GzipFile(filename="", fileobj=out, mode="wb", mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for info in entries:
            member = _tar_info(info)
            if member.isdir():
                tar.addfile(member)
                continue
            with archive.open(info) as body:
                tar.addfile(member, body)
    return out
