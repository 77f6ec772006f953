"""Checkpoint uploads: plan presigned targets under the attempt's prefix, verify, publish.

An attempt may write only under ``<job prefix>attempts/<n>/`` because the server builds every key
from the authenticated attempt; a zombie agent on an old host cannot touch the new attempt's
objects. A checkpoint is ready only when its object was verified and ``manifest.json`` beside it
was written, last, with a create-only PUT.

An attempt that ended can never complete an upload (its token is dead), but the URLs it was
given stay valid for ``PRESIGN_TTL_S``, and a host frozen mid-PUT finishes the PUT when it
thaws. So: the local store refuses such writes (``late_write_refusal``, its write guard); on
S3 what lands is deleted, once when the attempt closes and again by a sweep until its URLs
have expired (``discard_unfinished``, ``sweep_late_uploads``), so no stray object bills
storage for ever and no unfinished multipart upload keeps its parts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.models import Attempt, AttemptState, Checkpoint, CheckpointState
from nomadgpu.storage import PRESIGN_TTL_S, ObjectStore, object_store

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1
SINGLE_PUT_LIMIT = 64 * 1024 * 1024  # above this, multipart (part size: ``part_size_for``)
# 16 MB parts, a few in flight, kept pace with boto3's upload_file (8 MB parts, 10 threads);
# 64 MB parts made the agent wait on each part's round trip (bench/upload.py).
PART_SIZE = 16 * 1024 * 1024
MAX_PARTS = 10_000
MAX_PART_SIZE = 5 * 1024**3  # S3's limit; R2 and MinIO have the same
LATE_WRITE_MARGIN_S = 5 * 60  # a PUT begun just before its URL expired (``late_write_window``)


class CheckpointRefused(Exception):
    """The agent's checkpoint request or report cannot be accepted; the message says why."""


@dataclass(frozen=True)
class UploadPlan:
    checkpoint: Checkpoint
    upload: dict


def checkpoint_key(attempt: Attempt, step: int, *, encrypted: bool) -> str:
    suffix = ".ngck" if encrypted else ""
    return f"{attempt.storage_prefix}checkpoints/{step}/checkpoint.tar{suffix}"


def manifest_key(checkpoint: Checkpoint) -> str:
    return checkpoint.key.rsplit("/", 1)[0] + "/manifest.json"


def parts_needed(size: int, part_size: int = PART_SIZE) -> int:
    return max(1, -(-size // part_size))


def part_size_for(size: int) -> int:
    """The part size of a multipart upload of SIZE bytes: PART_SIZE, or more (in whole MiB)
    when PART_SIZE would need more than MAX_PARTS parts (objects above ~160 GB)."""
    mib = 1024 * 1024
    return max(PART_SIZE, -(-size // MAX_PARTS // mib) * mib)


def plan_upload(attempt: Attempt, *, step: int, size: int, encrypted: bool) -> UploadPlan:
    """Create (or reuse, when the agent asks again) the checkpoint row and its upload targets."""
    if part_size_for(size) > MAX_PART_SIZE:
        raise CheckpointRefused(f"checkpoint of {size} bytes needs more than {MAX_PARTS} parts")
    store = object_store(attempt.job.team)
    checkpoint = _checkpoint_row(attempt, step=step, size=size, encrypted=encrypted, store=store)
    if checkpoint.upload_id:
        parts = [
            {"part_number": n, "url": store.presign_part(checkpoint.key, checkpoint.upload_id, n)}
            for n in range(1, parts_needed(size, checkpoint.part_size) + 1)
        ]
        upload = {"kind": "multipart", "part_size": checkpoint.part_size, "parts": parts}
    else:
        upload = {"kind": "single", "url": store.presign_put(checkpoint.key), "headers": {}}
    return UploadPlan(checkpoint=checkpoint, upload=upload)


def _checkpoint_row(
    attempt: Attempt, *, step: int, size: int, encrypted: bool, store: ObjectStore
) -> Checkpoint:
    existing = Checkpoint.objects.filter(attempt=attempt, step=step).first()
    if existing is not None:
        if existing.state != CheckpointState.UPLOADING:
            raise CheckpointRefused(f"checkpoint for step {step} is already {existing.state}")
        if existing.size != size or existing.encrypted != encrypted:
            raise CheckpointRefused(f"checkpoint for step {step} was announced with another size")
        return existing
    key = checkpoint_key(attempt, step, encrypted=encrypted)
    upload_id = store.create_multipart(key) if size > SINGLE_PUT_LIMIT else ""
    try:
        with transaction.atomic():
            return Checkpoint.objects.create(
                job_id=attempt.job_id,
                attempt=attempt,
                step=step,
                key=key,
                size=size,
                encrypted=encrypted,
                upload_id=upload_id,
                part_size=part_size_for(size) if upload_id else None,
            )
    except IntegrityError:  # the same request twice at once: the other one created it
        return Checkpoint.objects.get(attempt=attempt, step=step)


def complete_upload(
    checkpoint: Checkpoint,
    *,
    size: int,
    sha256: str,
    parts: list[tuple[int, str]],
    now: datetime,
) -> Checkpoint:
    """Finish the upload, check the stored object, write the manifest last, mark it ready."""
    if checkpoint.state == CheckpointState.READY:
        if checkpoint.sha256 != sha256:
            raise CheckpointRefused("checkpoint already completed with another sha256")
        return checkpoint  # a repeated complete is harmless
    if size != checkpoint.size:
        raise CheckpointRefused(f"announced {checkpoint.size} bytes, completed {size}")
    store = object_store(checkpoint.attempt.job.team)
    if checkpoint.upload_id:
        if len(parts) != parts_needed(size, checkpoint.part_size):
            raise CheckpointRefused(f"expected {parts_needed(size)} parts, got {len(parts)}")
        store.complete_multipart(checkpoint.key, checkpoint.upload_id, parts)
    info = store.head(checkpoint.key)
    if info is None or info.size != size:
        found = "nothing" if info is None else f"{info.size} bytes"
        raise CheckpointRefused(f"storage holds {found} at the checkpoint key, not {size} bytes")
    manifest = {
        "format_version": MANIFEST_VERSION,
        "job": checkpoint.job_id,
        "attempt": checkpoint.attempt.number,
        "step": checkpoint.step,
        "object": checkpoint.key.rsplit("/", 1)[1],
        "size": size,
        "sha256": sha256,
        "encrypted": checkpoint.encrypted,
        "created_at": now.isoformat(),
    }
    store.put_bytes(manifest_key(checkpoint), json.dumps(manifest).encode(), only_if_absent=True)
    made_ready = Checkpoint.objects.filter(
        pk=checkpoint.pk, state=CheckpointState.UPLOADING
    ).update(state=CheckpointState.READY, sha256=sha256, ready_at=now)
    if not made_ready:
        # The attempt closed while this complete ran and its uploads were given up
        # (``discard_unfinished``): this checkpoint is not the job's to resume from.
        store.delete_keys([manifest_key(checkpoint)])
        checkpoint.refresh_from_db()
        raise CheckpointRefused(
            f"checkpoint for step {checkpoint.step} is {checkpoint.state}: "
            "its attempt ended before it completed"
        )
    checkpoint.refresh_from_db()
    return checkpoint


def prune_old(job_id: int, *, keep_last: int) -> list[str]:
    """Delete ready checkpoints beyond the newest KEEP_LAST; return the deleted keys."""
    stale = list(
        Checkpoint.objects.filter(job_id=job_id)
        .ready()
        .select_related("attempt__job__team")
        .newest_first()[keep_last:]
    )
    if not stale:
        return []
    store = object_store(stale[0].attempt.job.team)
    keys = [key for c in stale for key in (c.key, manifest_key(c))]
    store.delete_keys(keys)
    Checkpoint.objects.filter(pk__in=[c.pk for c in stale]).update(state=CheckpointState.PRUNED)
    return keys


# --- Writes that come too late ---------------------------------------------------------------


def late_write_refusal(key: str) -> str | None:
    """Why a signed PUT to KEY must not land now, or None. A checkpoint's object may be written
    only while the checkpoint is uploading and its attempt is live: a fenced agent's upload, or
    one more PUT over an object a manifest already vouches for, is refused. A key that is no
    checkpoint's is left to the signature alone."""
    row = (
        Checkpoint.objects.filter(key=key).order_by().values_list("state", "attempt__state").first()
    )
    if row is None:
        return None
    state, attempt_state = row
    if attempt_state == AttemptState.ENDED:
        return "the attempt this upload belongs to has ended: its agent was fenced"
    if state != CheckpointState.UPLOADING:
        return f"this checkpoint is {state}: its object can no longer be written"
    return None


def discard_unfinished(attempt_id: int) -> list[str]:
    """Give up an ended attempt's uploads, which can never complete: each uploading one is
    marked failed, then for every failed one the multipart upload is aborted and whatever
    landed at its key (and a manifest beside it) deleted. Returns the keys deleted. Safe to
    repeat (the sweep does).

    Marking comes first, guarded: an agent's complete that passed its token check before the
    close may still be finishing, and exactly one of the two moves a row out of uploading. The
    complete that loses is refused (``complete_upload``); the one that wins keeps its row
    ready, and a ready row's object is never touched here."""
    attempt = Attempt.objects.select_related("job__team").filter(pk=attempt_id).first()
    if attempt is None or attempt.state != AttemptState.ENDED:
        return []
    Checkpoint.objects.filter(attempt=attempt, state=CheckpointState.UPLOADING).update(
        state=CheckpointState.FAILED
    )
    failed = list(Checkpoint.objects.filter(attempt=attempt, state=CheckpointState.FAILED))
    if not failed:
        return []
    store = object_store(attempt.job.team)
    for checkpoint in failed:
        if checkpoint.upload_id:
            try:
                store.abort_multipart(checkpoint.key, checkpoint.upload_id)
            except Exception as exc:  # aborted before, or storage unreachable: the row stays
                logger.info("abort of %s's upload: %s", checkpoint.key, exc)  # failed, retried
    keys = [key for c in failed for key in (c.key, manifest_key(c))]
    store.delete_keys(keys)
    return keys


def late_write_window() -> timedelta:
    """How long after an attempt ends the sweep still looks for its late writes: its URLs'
    lifetime, one sweep interval (the last sweep inside may come that early) and a margin for a
    PUT begun just before the URL expired."""
    return timedelta(
        seconds=PRESIGN_TTL_S + settings.LATE_UPLOAD_SWEEP_INTERVAL_S + LATE_WRITE_MARGIN_S
    )


def sweep_late_uploads(*, now: datetime) -> int:
    """``discard_unfinished`` for every attempt that ended within ``late_write_window`` and
    left an upload unfinished (an S3 PUT may land any time its URL is valid); returns how many
    attempts it went over. One attempt's broken storage does not stop the others."""
    attempt_ids = (
        Checkpoint.objects.filter(
            state__in=[CheckpointState.UPLOADING, CheckpointState.FAILED],
            attempt__state=AttemptState.ENDED,
            attempt__ended_at__gte=now - late_write_window(),
        )
        .order_by()  # the default ordering's columns would make DISTINCT per checkpoint
        .values_list("attempt_id", flat=True)
        .distinct()
    )
    swept = 0
    for attempt_id in attempt_ids:
        try:
            discard_unfinished(attempt_id)
        except Exception:  # storage down or misconfigured: the next sweep tries again
            logger.exception("discarding the late uploads of attempt %s failed", attempt_id)
        swept += 1
    return swept
