"""Code packs: a job's own code (``workdir``) stored once by content in the team's storage,
and the local store's guard over their objects (``write_refusal``).

A pack is a gzipped tar of the code folder, named by the sha256 of its bytes, so unchanged
code is never uploaded twice (``request_upload`` answers "ready"). A plain pack goes straight
to the team's storage through a presigned PUT, and ``complete_upload`` reads it back and checks
its size and sha256 before it may be used. An encrypted pack (for a job that encrypts its
checkpoints) is PUT to the member API instead: the server encrypts the stream with ngck1 under
the pack's own data key as it arrives (``receive_pack``) and stores only ciphertext, so the
plaintext never reaches the bucket and the CLI needs no cryptography of its own. The portal's
form, which already holds the bytes, stores its pack the same way (``store_pack``).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from django.conf import settings
from django.utils import timezone

from agent.ckptcrypto import EncryptingWriter
from jobs.models import WorkdirPack, WorkdirPackState
from nomadgpu.crypto import new_data_key
from nomadgpu.storage import READ_CHUNK, object_store

MB = 1024 * 1024
READY = WorkdirPackState.READY
UPLOADING = WorkdirPackState.UPLOADING
PACK_KEY = re.compile(r"^teams/([^/]+)/workdirs/([0-9a-f]{64})\.tar\.gz(\.ngck1)?$")
PACK_FOLDER = re.compile(r"^teams/[^/]+/workdirs/")


class WorkdirRefused(Exception):
    """A workdir that cannot be used as given; the message is the sentence for the user and
    ``about`` the field it is about (``sha256``, ``url``, ``ref``, ``deploy_key_secret``)."""

    status = 422

    def __init__(self, message: str, *, about: str = "") -> None:
        super().__init__(message)
        self.about = about


class PackTooLarge(WorkdirRefused):
    status = 413


class PackMismatch(WorkdirRefused):
    """What was uploaded is not the pack announced (size or sha256)."""

    status = 409


class PackNotFound(WorkdirRefused):
    status = 404


class PackUnavailable(WorkdirRefused):
    """A job's ready pack is gone from the database: its agent cannot get the code."""

    status = 409


# --- Decisions ------------------------------------------------------------------------------


def max_bytes() -> int:
    """The size cap of a pack before encryption (``WORKDIR_MAX_MB``, MiB)."""
    return settings.WORKDIR_MAX_MB * MB


def size_refusal(size: int) -> str | None:
    """Why a pack of SIZE bytes is refused, or None under the cap."""
    if size <= max_bytes():
        return None
    shown = math.ceil(size / MB * 10) / 10  # rounded up: 200.01 MB must not read "200.0"
    return (
        f"the code pack is {shown:g} MB; the limit is {settings.WORKDIR_MAX_MB} MB (WORKDIR_MAX_MB)"
    )


def mismatch(pack: WorkdirPack, *, sha256: str, size: int) -> str | None:
    """Why bytes of SIZE and SHA256 are not PACK, or None when they are."""
    if size != pack.size:
        return f"the uploaded code pack is {size} bytes; {pack.size} were announced"
    if sha256 != pack.sha256:
        return f"the uploaded code pack's sha256 is {sha256}, not {pack.sha256}"
    return None


def short(sha256: str) -> str:
    return sha256[:12]


# --- Uploads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadPlan:
    """The answer to an upload request: READY (nothing to send), or where to PUT the pack:
    ``via`` "storage" (``url`` presigned) or "api" (the member API's own endpoint)."""

    sha256: str
    state: str
    via: str = ""
    url: str = ""


def request_upload(*, team, sha256: str, size: int, encrypted: bool) -> UploadPlan:
    """Plan the upload of TEAM's pack SHA256 of SIZE bytes. Raises PackTooLarge over the cap."""
    if why := size_refusal(size):
        raise PackTooLarge(why, about="size")
    pack = _pack_for(team, sha256=sha256, size=size, encrypted=encrypted)
    if _ready_and_stored(pack):
        return UploadPlan(sha256, READY)
    if encrypted:
        return UploadPlan(sha256, UPLOADING, via="api")
    url = object_store(team).presign_put(pack.key)
    return UploadPlan(sha256, UPLOADING, via="storage", url=url)


def _pack_for(team, *, sha256: str, size: int, encrypted: bool) -> WorkdirPack:
    pack, _ = WorkdirPack.objects.get_or_create(
        team=team,
        sha256=sha256,
        encrypted=encrypted,
        defaults={"size": size, "data_key": new_data_key() if encrypted else ""},
    )
    if pack.state == UPLOADING and pack.size != size:
        # Announced again with another size (an earlier request was wrong): the new one counts.
        WorkdirPack.objects.filter(pk=pack.pk, state=UPLOADING).update(size=size)
        pack.size = size
    return pack


def _ready_and_stored(pack: WorkdirPack) -> bool:
    """Whether PACK is ready and its object still there; a ready pack whose object is gone
    (a bucket emptied by hand) is uploading again, so the next upload restores it."""
    if pack.state != READY:
        return False
    found = object_store(pack.team).head(pack.key)
    if found is not None and found.size == pack.stored_size:
        return True
    WorkdirPack.objects.filter(pk=pack.pk, state=READY).update(state=UPLOADING, ready_at=None)
    pack.state = UPLOADING
    return False


def _existing(team, *, sha256: str, encrypted: bool) -> WorkdirPack:
    pack = WorkdirPack.objects.filter(team=team, sha256=sha256, encrypted=encrypted).first()
    if pack is None:
        kind = "encrypted" if encrypted else "plain"
        raise PackNotFound(
            f"team {team.slug} has no {kind} code pack {short(sha256)}: ask for its upload "
            "first (POST /api/workdirs)",
            about="sha256",
        )
    return pack


def complete_upload(*, team, sha256: str, encrypted: bool) -> WorkdirPack:
    """Check what was PUT for TEAM's plain pack SHA256 (size, sha256 of the stored object) and
    mark it ready. Raises PackMismatch (the object is deleted, the pack stays uploading) or
    PackNotFound. An encrypted pack is finished by ``receive_pack`` instead."""
    pack = _existing(team, sha256=sha256, encrypted=encrypted)
    if pack.state == READY:
        return pack
    if pack.encrypted:
        raise PackMismatch(
            "an encrypted code pack is finished by its PUT to the member API "
            f"(/api/workdirs/{sha256}/content), not by complete"
        )
    store = object_store(team)
    if store.head(pack.key) is None:
        raise PackMismatch(f"nothing has been uploaded for code pack {short(sha256)} yet")
    stored_sha256, stored_size = _digest(store.open_read(pack.key))
    if problem := mismatch(pack, sha256=stored_sha256, size=stored_size):
        store.delete_keys([pack.key])
        raise PackMismatch(problem)
    return _mark_ready(pack, stored_sha256=stored_sha256, stored_size=stored_size)


def _digest(stream: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with stream:
        while chunk := stream.read(READ_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _mark_ready(pack: WorkdirPack, *, stored_sha256: str, stored_size: int) -> WorkdirPack:
    # Guarded: of two completes racing, the second finds the pack ready and changes nothing.
    WorkdirPack.objects.filter(pk=pack.pk, state=UPLOADING).update(
        state=READY, stored_sha256=stored_sha256, stored_size=stored_size, ready_at=timezone.now()
    )
    pack.refresh_from_db()
    return pack


def receive_pack(*, team, sha256: str, chunks: Iterator[bytes]) -> WorkdirPack:
    """Take the plaintext of TEAM's encrypted pack SHA256 from CHUNKS (the member API's PUT),
    encrypt and store it, and mark it ready. A ready pack ignores the body."""
    pack = _existing(team, sha256=sha256, encrypted=True)
    if pack.state == READY:
        return pack
    return _ingest(pack, chunks)


def store_pack(*, team, sha256: str, size: int, source: BinaryIO, encrypted: bool) -> WorkdirPack:
    """Store the pack SOURCE holds (the portal's upload, already hashed) for TEAM, encrypted
    when ENCRYPTED; a pack already stored is not written again."""
    if why := size_refusal(size):
        raise PackTooLarge(why, about="size")
    pack = _pack_for(team, sha256=sha256, size=size, encrypted=encrypted)
    if _ready_and_stored(pack):
        return pack
    source.seek(0)
    return _ingest(pack, iter(lambda: source.read(READ_CHUNK), b""))


class _Counted:
    """A write-only file that hashes and counts what passes through it to DST."""

    def __init__(self, dst: BinaryIO) -> None:
        self.dst = dst
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.dst.write(data)


def _ingest(pack: WorkdirPack, chunks: Iterator[bytes]) -> WorkdirPack:
    """Spool CHUNKS (the plaintext pack) aside, encrypted when the pack is, check them against
    the pack, then store the spool and mark the pack ready. Nothing is stored on a mismatch."""
    with tempfile.TemporaryFile(dir=settings.VAR_DIR) as spool:
        stored = _Counted(spool)
        plain = hashlib.sha256()
        size = 0
        writer = _writer(pack, stored)
        for chunk in chunks:
            size += len(chunk)
            if size > pack.size:  # stop reading: a body longer than announced is refused
                raise PackMismatch(f"the upload is longer than the {pack.size} bytes announced")
            plain.update(chunk)
            writer.write(chunk)
        writer.close()
        if problem := mismatch(pack, sha256=plain.hexdigest(), size=size):
            raise PackMismatch(problem)
        spool.seek(0)
        object_store(pack.team).put_file(pack.key, spool)
    return _mark_ready(pack, stored_sha256=stored.sha256.hexdigest(), stored_size=stored.size)


class _Plain:
    def __init__(self, dst: _Counted) -> None:
        self.write = dst.write

    def close(self) -> None:
        pass


def _writer(pack: WorkdirPack, dst: _Counted):
    if not pack.encrypted:
        return _Plain(dst)
    return EncryptingWriter(dst, base64.b64decode(pack.data_key))  # type: ignore[arg-type]


# --- The local store's guard ----------------------------------------------------------------


def write_refusal(key: str) -> str | None:
    """Why a signed PUT to KEY must not land on the local store, or None. A key outside the
    code packs' folders is not this guard's to judge. Only a plain pack still uploading may be
    written (its presigned PUT); a ready pack is never written over, and an encrypted pack only
    ever by the server itself."""
    if not PACK_FOLDER.match(key):
        return None
    found = PACK_KEY.match(key)
    if found is None:
        return "this is not the key of a code pack"
    slug, sha256, encrypted = found.groups()
    if encrypted:
        return "an encrypted code pack is written by the server only"
    state = (
        WorkdirPack.objects.filter(team__slug=slug, sha256=sha256, encrypted=False)
        .values_list("state", flat=True)
        .first()
    )
    if state is None:
        return "no code pack is being uploaded at this key"
    if state != UPLOADING:
        return f"this code pack is {state}: its object can no longer be written"
    return None
