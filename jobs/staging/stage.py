"""Staged model weights: a job's ``stage`` entries mirrored once into its team's storage, checked
before any rent, and handed to every agent as presigned objects (docs/staged-weights.md).

An entry is a Hugging Face model repo at a revision, or one URL. The worker (``stage_job``)
first resolves every entry: the Hub's ``GET /api/models/{repo}/revision/{rev}?blobs=true``
gives the commit (``sha``) and the files (``siblings[].rfilename``, ``size``), as
``huggingface_hub.HfApi.model_info(files_metadata=True)`` asks; a URL is asked with HEAD. A repo,
revision or file that does not exist (404), or a gated or private repo without a token
(401/403), fails the job there, before any host is rented, with what to do. Then each entry is
mirrored into a ``StagedObject`` named by what it holds (the repo at its *commit* and the
globs, or the URL), so a second job with the same entry reuses the stored bytes; files come
from ``{HF_ENDPOINT}/{repo}/resolve/{commit}/{path}``, with ``Authorization: Bearer`` when the
job names an ``HF_TOKEN`` secret, and are encrypted (ngck1, the object's own key) when the job
encrypts its checkpoints. Only then is the job's first rent planned.

The staged sizes replace the typed ``profile.model_gb`` in the cost model (``staged_gb``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Job, JobState, StagedObject, StagedObjectState
from jobs.staging import mirror, resolve
from jobs.staging.resolve import Resolved, StageRefused

logger = logging.getLogger(__name__)

STAGING, READY, FAILED = "staging", "ready", "failed"
GB = 1024**3  # the unit the cost model prices traffic in


class MirrorBusy(Exception):
    """Another task is mirroring the same entry right now: try again shortly."""


def needs_staging(stage: list | None) -> bool:
    """Whether a job with these ``stage`` entries must wait for a mirror before renting."""
    return bool(stage)


def stage_job(job_id: int, *, now: datetime) -> str:
    """Resolve and mirror JOB_ID's entries, then plan its first rent; a refusal fails the job
    (before any rent) with the reason. Returns the job's stage state. Safe to run twice: a
    job no longer staging is left alone, and files already mirrored are not copied again.
    Raises MirrorBusy (try later) and transport or storage errors (retried by the task)."""
    job = Job.objects.select_related("team").filter(pk=job_id, stage_state=STAGING).first()
    if job is None or lifecycle.is_terminal(job.state):
        return job.stage_state if job else ""
    token = resolve.hf_token(job)
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0)) as client:
        try:
            resolved = [resolve.resolve(client, entry, token) for entry in job.stage]
            objects = [_mirrored(client, job, r, token, now=now) for r in resolved]
        except StageRefused as exc:
            fail_staging(job.pk, why=str(exc), now=now)
            return FAILED
    return finish_staging(job.pk, objects, now=timezone.now())


def _mirrored(client, job: Job, resolved: Resolved, token, *, now: datetime) -> StagedObject:
    obj, usable = mirror.claim_mirror(
        job.team, resolved, encrypted=job.encrypt_checkpoints, now=now
    )
    # Linked at once: the job page shows the mirror's progress, and the watchdog sees that
    # this job's staging moves (``stalled_staging``) while it waits for another job's mirror.
    job.staged_objects.add(obj)
    if not usable:
        raise MirrorBusy(resolved.source)
    if obj.state == StagedObjectState.READY and mirror.stored_and_whole(obj):
        return obj
    try:
        mirror.mirror(client, obj, resolved, token)
    except Exception as exc:  # free the claim at once: another job may try it again now
        StagedObject.objects.filter(pk=obj.pk).update(
            state=StagedObjectState.FAILED, error=str(exc)[:2000]
        )
        raise
    obj.refresh_from_db()
    return obj


def stalled_staging(now: datetime) -> list[int]:
    """Jobs staging for longer than ``STAGE_NUDGE_AFTER_S`` none of whose mirrors moved in that
    time: their task's message may be lost (a broker restart), so the watchdog sends it again.
    A second task for a job is harmless: what is mirrored is not copied again."""
    quiet = now - timedelta(seconds=settings.STAGE_NUDGE_AFTER_S)
    moving = StagedObject.objects.filter(
        jobs=OuterRef("pk"), state=StagedObjectState.MIRRORING, created_at__gte=quiet
    )
    waiting = Job.objects.filter(stage_state=STAGING, state=JobState.QUEUED, updated_at__lt=quiet)
    return list(waiting.exclude(Exists(moving)).values_list("pk", flat=True))


def nudge_staging(now: datetime) -> int:
    """Send the stage task again for each of ``stalled_staging``; at most once per nudge
    interval per job (its ``updated_at`` moves). Returns how many were sent."""
    sent = 0
    for job_id in stalled_staging(now):
        if Job.objects.filter(pk=job_id, stage_state=STAGING).update(updated_at=now):
            lifecycle.send_task(lifecycle.STAGE_TASK, job_id)
            sent += 1
    return sent


def finish_staging(job_id: int, objects: list[StagedObject], *, now: datetime) -> str:
    """Mark JOB_ID's staging ready with OBJECTS and plan its rent (after commit)."""
    staged = sum(o.bytes_total for o in objects)
    with transaction.atomic():
        if not Job.objects.filter(pk=job_id, stage_state=STAGING).update(stage_state=READY):
            return ""
        Job.objects.get(pk=job_id).staged_objects.set(objects)
        lifecycle.record_event(
            job_id,
            now=now,
            kind="staged",
            message=f"{len(objects)} stage entr{'y' if len(objects) == 1 else 'ies'} "
            f"in the team's storage ({staged / 1e9:.2f} GB)",
            bytes=staged,
        )
        lifecycle.after_commit(lifecycle.plan_rent, job_id, now=now)
    return READY


def fail_staging(job_id: int, *, why: str, now: datetime) -> None:
    """JOB_ID's stage entries cannot be staged: the job fails with WHY, no host was rented."""
    with transaction.atomic():
        Job.objects.filter(pk=job_id, stage_state=STAGING).update(stage_state=FAILED)
        if Job.objects.filter(pk=job_id, state=JobState.QUEUED).exists():
            lifecycle.fail_job(job_id, why=f"staging: {why}", now=now)


def progress(job: Job) -> dict | None:
    """JOB's staging progress (files and bytes done of total, over all its entries), or None
    for a job that stages nothing."""
    if not job.stage_state:
        return None
    objects = list(job.staged_objects.all())
    out = {
        "state": job.stage_state,
        "entries": len(job.stage or []),
        "files_done": sum(o.files_done for o in objects),
        "files_total": sum(o.files_total for o in objects),
        "bytes_done": sum(o.bytes_done for o in objects),
        "bytes_total": sum(o.bytes_total for o in objects),
    }
    return {**out, "text": progress_text(out)}


def progress_text(p: dict) -> str:
    """ "staging: 3 of 10 files, 1.20 of 4.00 GB" (or "staged: ...", "staging failed")."""
    if p["state"] == FAILED:
        return "staging failed"
    verb = "staging" if p["state"] == STAGING else "staged"
    files = f"{p['files_done']} of {p['files_total']} file{'s' if p['files_total'] != 1 else ''}"
    return f"{verb}: {files}, {p['bytes_done'] / 1e9:.2f} of {p['bytes_total'] / 1e9:.2f} GB"


def staged_gb(job: Job) -> float | None:
    """GB the agent downloads from the team's storage on every host (the cost model's model
    download), None until the job's staging is ready."""
    if job.stage_state != READY:
        return None
    sizes = job.staged_objects.values_list("bytes_total", flat=True)
    return sum(sizes) / GB
