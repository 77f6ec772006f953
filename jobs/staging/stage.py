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

From the moment the task starts, the job says what it is doing ("staging: resolving stage[0]
hf Qwen/NoSuch …", an event the page, API and CLI read through ``progress``), and a failure
names its entry and cause: a refusal fails the job at once, a network fault or a fault of the
source is tried again on ``trouble.RETRY_DELAYS_S`` (``retry_or_fail``), each retry on the
timeline.

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
from jobs.models import Job, JobEvent, JobState, StagedObject, StagedObjectState
from jobs.staging import mirror, resolve, trouble
from jobs.staging.resolve import Resolved

logger = logging.getLogger(__name__)

STAGING, READY, FAILED = "staging", "ready", "failed"
# The events of a staging task: what it is doing, and a retry after a transient fault.
DOING, RETRYING = "staging", "staging_retry"
GB = 1024**3  # the unit the cost model prices traffic in


class MirrorBusy(Exception):
    """Another task is mirroring the same entry right now: try again shortly."""


def needs_staging(stage: list | None) -> bool:
    """Whether a job with these ``stage`` entries must wait for a mirror before renting."""
    return bool(stage)


def stage_job(job_id: int, *, now: datetime) -> str:
    """Resolve and mirror JOB_ID's entries, then plan its first rent. Returns the job's stage
    state. Safe to run twice: a job no longer staging is left alone, and files already
    mirrored are not copied again. Raises MirrorBusy (try later) and StageTrouble (what went
    wrong on which entry; ``retry_or_fail`` decides)."""
    job = Job.objects.select_related("team").filter(pk=job_id, stage_state=STAGING).first()
    if job is None or lifecycle.is_terminal(job.state):
        return job.stage_state if job else ""
    # The task is alive: the watchdog's nudge (``stalled_staging``) leaves it alone.
    Job.objects.filter(pk=job_id).update(updated_at=now)
    labels = [trouble.entry_label(i, entry) for i, entry in enumerate(job.stage)]
    token = resolve.hf_token(job)
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0)) as client:
        resolved = []
        for label, entry in zip(labels, job.stage, strict=True):
            _say(job_id, f"resolving {label}", now=now)
            with trouble.about(label, trouble.source_of(entry)):
                resolved.append(resolve.resolve(client, entry, token))
        objects = [
            _mirrored(client, job, r, token, label=label, source=trouble.source_of(entry), now=now)
            for label, entry, r in zip(labels, job.stage, resolved, strict=True)
        ]
    return finish_staging(job.pk, objects, now=timezone.now())


def _say(job_id: int, message: str, *, now: datetime) -> None:
    """A "staging" event saying what the task does now (once per job: a retry does not repeat
    it); the page shows the newest until bytes flow."""
    if not JobEvent.objects.filter(job_id=job_id, kind=DOING, message=message).exists():
        lifecycle.record_event(job_id, now=now, kind=DOING, message=message)


def retry_or_fail(
    job_id: int, problem: trouble.StageTrouble, *, failures: int, now: datetime
) -> float | None:
    """After the FAILURES-th failure (1-based) of JOB_ID's staging with PROBLEM: the seconds to
    wait before trying again, the retry on the job's timeline; or None, the job failed with
    the sentence (a permanent cause, or the tries spent)."""
    delay = trouble.retry_delay(problem, failures=failures)
    if delay is None:
        fail_staging(job_id, why=problem.sentence, now=now)
        return None
    with transaction.atomic():
        lifecycle.record_event(
            job_id, now=now, kind=RETRYING, message=problem.retrying(delay, failures),
            attempt=failures, delay_s=delay,
        )  # fmt: skip
        Job.objects.filter(pk=job_id).update(updated_at=now)
    return delay


def _mirrored(
    client, job: Job, resolved: Resolved, token, *, label: str, source: str, now: datetime
) -> StagedObject:
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
        with trouble.about(label, source):
            mirror.mirror(client, obj, resolved, token)
    except trouble.StageTrouble as exc:  # free the claim at once: another job may try it now
        StagedObject.objects.filter(pk=obj.pk).update(
            state=StagedObjectState.FAILED, error=exc.sentence[:2000]
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
    """JOB's staging progress (files and bytes done of total, over all its entries, and what
    the task said last), or None for a job that stages nothing."""
    if not job.stage_state:
        return None
    objects = list(job.staged_objects.all())
    said = job.events.filter(kind__in=(DOING, RETRYING)).order_by("-created_at", "-id").first()
    moved = [o.created_at for o in objects if o.state == StagedObjectState.MIRRORING]
    out = {
        "state": job.stage_state,
        "entries": len(job.stage or []),
        "files_done": sum(o.files_done for o in objects),
        "files_total": sum(o.files_total for o in objects),
        "bytes_done": sum(o.bytes_done for o in objects),
        "bytes_total": sum(o.bytes_total for o in objects),
        # What the task said last, while no mirror has moved since (then the bytes tell).
        "doing": said.message if said and not any(m > said.created_at for m in moved) else "",
    }
    return {**out, "text": progress_text(out)}


def progress_text(p: dict) -> str:
    """ "staging: resolving stage[0] hf org/x …", "staging: 3 of 10 files, 1.20 of 4.00 GB",
    "staging: waiting for a worker" (the task has not started), "staged: ...", "staging
    failed"."""
    if p["state"] == FAILED:
        return "staging failed"
    if p["state"] == STAGING and p.get("doing"):
        return f"staging: {p['doing']}" + (" …" if p["doing"].startswith("resolving") else "")
    if p["state"] == STAGING and not p["files_total"]:
        return "staging: waiting for a worker"
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
