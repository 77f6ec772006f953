"""Staged model weights: a job's ``stage`` entries mirrored once into its team's storage, checked
before any rent, and handed to every agent as presigned objects (README "Staged model weights").

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

import base64
import fnmatch
import hashlib
import logging
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agent.ckptcrypto import EncryptingWriter
from jobs import lifecycle
from jobs.models import Job, JobState, StagedObject, StagedObjectState
from nomadgpu import team_secrets
from nomadgpu.crypto import new_data_key
from nomadgpu.storage import READ_CHUNK, object_store

logger = logging.getLogger(__name__)

STAGING, READY, FAILED = "staging", "ready", "failed"
TOKEN_SECRET = "HF_TOKEN"
# A mirror whose row has not moved for this long is taken to be dead (its worker died) and is
# taken over; until then a second job's task waits for it instead of mirroring the same bytes.
STALE_MIRROR = timedelta(minutes=5)
PROGRESS_EVERY = 64 * 1024 * 1024  # bytes between progress writes while one file streams in
GB = 1024**3  # the unit the cost model prices traffic in


class StageRefused(Exception):
    """An entry that cannot be staged as given (it does not exist, or needs a token); the
    message says what is wrong and what to do."""


class MirrorBusy(Exception):
    """Another task is mirroring the same entry right now: try again shortly."""


@dataclass(frozen=True)
class RemoteFile:
    path: str  # in the repo (or the URL entry's target path)
    url: str
    size: int | None


@dataclass(frozen=True)
class Resolved:
    """An entry as the source answered it: what to store under which name."""

    kind: str
    source: str
    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]


# --- Decisions ------------------------------------------------------------------------------


def hf_endpoint() -> str:
    return settings.HF_ENDPOINT.rstrip("/")


def needs_staging(stage: list | None) -> bool:
    """Whether a job with these ``stage`` entries must wait for a mirror before renting."""
    return bool(stage)


def matching(paths: Iterable[str], globs: list[str]) -> list[str]:
    """PATHS that match any of GLOBS (fnmatch, on the whole path); all when GLOBS is empty."""
    if not globs:
        return sorted(paths)
    return sorted(p for p in paths if any(fnmatch.fnmatch(p, g) for g in globs))


def hub_refusal(status: int, error_code: str, *, repo: str, revision: str, token: bool) -> str:
    """The sentence for the Hub's answer STATUS (and its ``X-Error-Code``) about REPO, read as
    ``huggingface_hub.utils.hf_raise_for_status`` reads them. The Hub answers 401
    ``RepoNotFound`` to an anonymous caller for a repo that does not exist *or* is private, so
    that sentence names both."""
    if error_code == "RevisionNotFound":
        return f"{repo} has no revision {revision!r}: check the branch, tag or commit"
    if error_code == "EntryNotFound":
        return f"{repo}@{revision} lacks a file it lists: check the revision"
    if error_code == "GatedRepo" or (status == 403 and token):
        if token:
            return (
                f"{repo} is gated and the team's {TOKEN_SECRET} may not read it: accept its "
                f"terms at {hf_endpoint()}/{repo} with that token's account"
            )
        return (
            f"{repo} is gated: add {TOKEN_SECRET} (a token of an account that accepted its "
            f"terms) to the team's secrets and name it in the job's secrets"
        )
    if error_code == "RepoNotFound" or status in (401, 404):
        if token:
            return f"{repo} does not exist on {hf_endpoint()}, or {TOKEN_SECRET} may not read it"
        return (
            f"{repo} does not exist on {hf_endpoint()}, or is private: check the repo id; for "
            f"a private repo add {TOKEN_SECRET} to the team's secrets and name it in secrets"
        )
    return f"the Hub answered {status} for {repo}@{revision}"


def source_of(
    kind: str, *, repo: str = "", commit: str = "", globs=(), url: str = "", path: str = ""
) -> str:
    """The name a mirror is stored and found again by: what it holds, never which job."""
    if kind == "hf":
        return f"hf:{repo}@{commit}:{','.join(sorted(globs))}"
    return f"url:{url} -> {path}"


# --- Resolving ------------------------------------------------------------------------------


def hub_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def resolve_hf(client: httpx.Client, entry: dict, token: str | None) -> Resolved:
    """ENTRY's repo at its revision: the commit and the files to mirror. Raises StageRefused."""
    repo, revision, globs = entry["hf"], entry.get("revision") or "main", entry.get("files") or []
    url = f"{hf_endpoint()}/api/models/{repo}/revision/{quote(revision, safe='')}"
    response = client.get(url, params={"blobs": "true"}, headers=hub_headers(token))
    if response.status_code != 200:
        code = response.headers.get("X-Error-Code", "")
        raise StageRefused(
            hub_refusal(response.status_code, code, repo=repo, revision=revision, token=bool(token))
        )
    info = response.json()
    commit = str(info["sha"])
    sizes = {s["rfilename"]: s.get("size") for s in info.get("siblings") or []}
    paths = matching(sizes, globs)
    if not paths:
        wanted = ", ".join(globs) if globs else "any file"
        raise StageRefused(f"{repo}@{revision} has no file matching {wanted}: check files")
    files = tuple(
        RemoteFile(p, f"{hf_endpoint()}/{repo}/resolve/{commit}/{quote(p)}", sizes[p])
        for p in paths
    )
    # A gated repo's info is public; its files are not. One HEAD finds that out now, before
    # any byte of this or a later entry is mirrored (a 302 is an LFS file's CDN redirect).
    head = client.head(files[0].url, headers=hub_headers(token))
    if head.status_code >= 400:
        code = head.headers.get("X-Error-Code", "")
        raise StageRefused(
            hub_refusal(head.status_code, code, repo=repo, revision=revision, token=bool(token))
        )
    source = source_of("hf", repo=repo, commit=commit, globs=globs)
    return Resolved("hf", source, repo, revision, commit, files)


def resolve_url(client: httpx.Client, entry: dict) -> Resolved:
    """ENTRY's URL, asked with HEAD (a server that does not answer HEAD is tried at download)."""
    url = entry["url"]
    response = client.head(url, follow_redirects=True)
    if response.status_code in (401, 403, 404, 410):
        raise StageRefused(f"{url} answered {response.status_code}: check the URL")
    length = response.headers.get("Content-Length") if response.status_code == 200 else None
    size = int(length) if length and length.isdigit() else None
    files = (RemoteFile(entry["path"], url, size),)
    return Resolved("url", source_of("url", url=url, path=entry["path"]), "", "", "", files)


def resolve(client: httpx.Client, entry: dict, token: str | None) -> Resolved:
    if "hf" in entry:
        return resolve_hf(client, entry, token)
    return resolve_url(client, entry)


# --- Mirroring ------------------------------------------------------------------------------


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
                raise StageRefused(_download_refusal(obj, remote, response, token))
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


def _download_refusal(obj: StagedObject, remote: RemoteFile, response, token) -> str:
    if obj.kind != "hf":
        return f"{remote.url} answered {response.status_code} to its download"
    code = response.headers.get("X-Error-Code", "")
    return hub_refusal(
        response.status_code, code, repo=obj.repo, revision=obj.revision, token=bool(token)
    )


def _etag(headers: httpx.Headers) -> str:
    """The Hub's name of a file's blob: ``X-Linked-Etag`` (an LFS file's sha256) or ``ETag``,
    normalised as ``huggingface_hub.file_download._normalize_etag`` does (no W/, no quotes)."""
    raw = headers.get("X-Linked-Etag") or headers.get("ETag") or ""
    etag = raw.removeprefix("W/").strip('"')
    return etag if etag and all(c.isalnum() or c in "-_." for c in etag) else ""


# --- The task's body ------------------------------------------------------------------------


def hf_token(job: Job) -> str | None:
    """The value of the team's HF_TOKEN secret when the job names it, else None."""
    if TOKEN_SECRET not in (job.secrets or []):
        return None
    return team_secrets.values_for(job.team_id, [TOKEN_SECRET]).get(TOKEN_SECRET)


def stage_job(job_id: int, *, now: datetime) -> str:
    """Resolve and mirror JOB_ID's entries, then plan its first rent; a refusal fails the job
    (before any rent) with the reason. Returns the job's stage state. Safe to run twice: a
    job no longer staging is left alone, and files already mirrored are not copied again.
    Raises MirrorBusy (try later) and transport or storage errors (retried by the task)."""
    job = Job.objects.select_related("team").filter(pk=job_id, stage_state=STAGING).first()
    if job is None or lifecycle.is_terminal(job.state):
        return job.stage_state if job else ""
    token = hf_token(job)
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0)) as client:
        try:
            resolved = [resolve(client, entry, token) for entry in job.stage]
            objects = [_mirrored(client, job, r, token, now=now) for r in resolved]
        except StageRefused as exc:
            fail_staging(job.pk, why=str(exc), now=now)
            return FAILED
    return finish_staging(job.pk, objects, now=timezone.now())


def _mirrored(client, job: Job, resolved: Resolved, token, *, now: datetime) -> StagedObject:
    obj, usable = claim_mirror(job.team, resolved, encrypted=job.encrypt_checkpoints, now=now)
    # Linked at once: the job page shows the mirror's progress, and the watchdog sees that
    # this job's staging moves (``stalled_staging``) while it waits for another job's mirror.
    job.staged_objects.add(obj)
    if not usable:
        raise MirrorBusy(resolved.source)
    if obj.state == StagedObjectState.READY and stored_and_whole(obj):
        return obj
    try:
        mirror(client, obj, resolved, token)
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


# --- What the job page, the cost model and the agent get -----------------------------------


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


def agent_stage(job: Job) -> list[dict]:
    """The ``stage`` of JOB's register reply (agent/PROTOCOL.md): per entry, where its files go
    and a presigned GET of each stored object with its stored size and sha256."""
    if job.stage_state != READY:
        return []
    objects = {o.source: o for o in job.staged_objects.select_related("team")}
    return [_for_agent(o) for o in sorted(objects.values(), key=lambda o: o.source)]


def _for_agent(obj: StagedObject) -> dict:
    store = object_store(obj.team)
    files = [
        {
            "path": f["path"],
            "etag": f["etag"],
            "size": f["size"],
            "object": {
                "url": store.presign_get(f["key"]),
                "size": f["stored_size"],
                "sha256": f["stored_sha256"],
            },
        }
        for f in obj.files
    ]
    return {
        "kind": obj.kind,
        "repo": obj.repo,
        "revision": obj.revision,
        "commit": obj.commit,
        "data_key_b64": obj.data_key if obj.encrypted else None,
        "files": files,
    }
