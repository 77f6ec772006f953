"""Mirroring a resolved entry into the team's storage: one ``StagedObject`` per entry, named by
what it holds (the repo at its *commit* and the globs, or the URL), so a second job with the same
entry reuses the stored bytes. Files come from ``{HF_ENDPOINT}/{repo}/resolve/{commit}/{path}``,
with ``Authorization: Bearer`` when the job names an ``HF_TOKEN`` secret, and are encrypted
(ngck1, the object's own key) when the job encrypts its checkpoints.
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from agent.ckptcrypto import EncryptingWriter
from jobs.models import StagedObject, StagedObjectState
from jobs.staging.resolve import RemoteFile, Resolved, answer_error, hub_headers, hub_refusal
from nomadgpu.crypto import new_data_key
from nomadgpu.storage import READ_CHUNK, object_store

# A mirror whose row has not moved for this long is taken to be dead (its worker died) and is
# taken over; until then a second job's task waits for it instead of mirroring the same bytes.
STALE_MIRROR = timedelta(minutes=5)
PROGRESS_EVERY = 64 * 1024 * 1024  # bytes between progress writes while one file streams in


def claim_mirror(
    team, resolved: Resolved, *, encrypted: bool, now: datetime
) -> tuple[StagedObject, bool]:
    """The StagedObject for RESOLVED and whether this task may use it now: it is ready, or
    claimed for this task to mirror. False while another task mirrors it and is alive (its
    row moved within STALE_MIRROR)."""
    fields = {
        "kind": resolved.kind,
        "repo": resolved.repo,
        "revision": resolved.revision,
        "commit": resolved.commit,
        "files_total": len(resolved.files),
        "data_key": new_data_key() if encrypted else "",
        "created_at": now,
    }
    try:
        with transaction.atomic():
            obj, created = StagedObject.objects.get_or_create(
                team=team, source=resolved.source, encrypted=encrypted, defaults=fields
            )
    except IntegrityError:  # another task created it between our get and create
        obj, created = (
            StagedObject.objects.get(team=team, source=resolved.source, encrypted=encrypted),
            False,
        )
    if created or obj.state == StagedObjectState.READY:
        return obj, True
    claimed = StagedObject.objects.filter(
        pk=obj.pk, state__in=[StagedObjectState.MIRRORING, StagedObjectState.FAILED]
    ).filter(_stale_or_failed(now))
    if not claimed.update(state=StagedObjectState.MIRRORING, created_at=now, error=""):
        return obj, False
    obj.refresh_from_db()
    return obj, True


def _stale_or_failed(now: datetime) -> Q:
    return Q(state=StagedObjectState.FAILED) | Q(created_at__lt=now - STALE_MIRROR)


def stored_and_whole(obj: StagedObject) -> bool:
    """Whether every file of the ready OBJ is still in storage at its recorded size."""
    store = object_store(obj.team)
    for entry in obj.files:
        found = store.head(entry["key"])
        if found is None or found.size != entry["stored_size"]:
            return False
    return bool(obj.files)


def mirror(client: httpx.Client, obj: StagedObject, resolved: Resolved, token: str | None) -> None:
    """Copy RESOLVED's files into OBJ's place in the team's storage, keeping the progress on
    the row, then mark it ready. A file already stored whole is not copied again."""
    done = {f["path"]: f for f in obj.files if isinstance(f, dict)}
    store = object_store(obj.team)
    files, bytes_done = [], 0
    total = sum(f.size or 0 for f in resolved.files)
    _progress(obj, files_done=0, bytes_done=0, bytes_total=total)
    for remote in resolved.files:
        known = done.get(remote.path)
        found = store.head(known["key"]) if known else None
        if known is None or found is None or found.size != known["stored_size"]:
            known = _copy_file(client, obj, remote, token, already=bytes_done, total=total)
        files.append(known)
        bytes_done += known["size"]
        _progress(obj, files_done=len(files), bytes_done=bytes_done, files=files)
    StagedObject.objects.filter(pk=obj.pk).update(
        state=StagedObjectState.READY,
        ready_at=timezone.now(),
        bytes_total=max(total, bytes_done),
    )


def _progress(obj: StagedObject, **fields) -> None:
    # created_at doubles as the mirror's liveness (claim_mirror): every write moves it.
    StagedObject.objects.filter(pk=obj.pk).update(created_at=timezone.now(), **fields)


class _Counted:
    """Write-through to DST that hashes and counts the bytes written."""

    def __init__(self, dst) -> None:
        self.dst, self.sha256, self.size = dst, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.dst.write(data)


def _copy_file(
    client: httpx.Client,
    obj: StagedObject,
    remote: RemoteFile,
    token: str | None,
    *,
    already: int,
    total: int,
) -> dict:
    """Stream REMOTE into a spool (encrypted when OBJ is), store it; its ``files`` entry."""
    key = obj.prefix + remote.path + (".ngck1" if obj.encrypted else "")
    headers = hub_headers(token) if obj.kind == "hf" else {}
    with tempfile.TemporaryFile(dir=settings.VAR_DIR) as spool:
        stored = _Counted(spool)
        key_bytes = base64.b64decode(obj.data_key) if obj.encrypted else b""
        writer = EncryptingWriter(stored, key_bytes) if obj.encrypted else stored
        plain, size, etag = hashlib.sha256(), 0, ""
        with client.stream("GET", remote.url, headers=headers, follow_redirects=True) as response:
            if response.status_code != 200:
                response.read()
                raise _download_error(obj, response, token)
            # The Hub names an LFS file in its redirect (X-Linked-Etag), not in the CDN's answer.
            first = response.history[0] if response.history else response
            etag = _etag(first.headers)
            for chunk in response.iter_bytes(READ_CHUNK):
                plain.update(chunk)
                writer.write(chunk)
                size += len(chunk)
                if size // PROGRESS_EVERY != (size - len(chunk)) // PROGRESS_EVERY:
                    moved = already + size
                    _progress(obj, bytes_done=moved, bytes_total=max(total, moved))
        if obj.encrypted:
            writer.close()  # type: ignore[union-attr]
        spool.seek(0)
        object_store(obj.team).put_file(key, spool)
    return {
        "path": remote.path,
        "size": size,
        "sha256": plain.hexdigest(),
        "etag": etag or plain.hexdigest(),
        "key": key,
        "stored_size": stored.size,
        "stored_sha256": stored.sha256.hexdigest(),
    }


def _download_error(obj: StagedObject, response: httpx.Response, token) -> Exception:
    """A download's answer that is no 200: refused, or worth another try (``answer_error``)."""
    status = response.status_code
    if obj.kind != "hf":
        refusal = f"answered {status} to its download: check the URL"
        return answer_error(response, refusal=refusal, source=response.request.url.host)
    code = response.headers.get("X-Error-Code", "")
    refusal = hub_refusal(status, code, repo=obj.repo, revision=obj.revision, token=bool(token))
    return answer_error(response, refusal=refusal, source="the Hub")


def _etag(headers: httpx.Headers) -> str:
    """The Hub's name of a file's blob: ``X-Linked-Etag`` (an LFS file's sha256) or ``ETag``,
    normalised as ``huggingface_hub.file_download._normalize_etag`` does (no W/, no quotes)."""
    raw = headers.get("X-Linked-Etag") or headers.get("ETag") or ""
    etag = raw.removeprefix("W/").strip('"')
    return etag if etag and all(c.isalnum() or c in "-_." for c in etag) else ""
