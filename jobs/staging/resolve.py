"""Resolving a job's ``stage`` entries at their source, before anything is mirrored: a Hugging
Face model repo at a revision (the Hub's commit and files), or one URL (asked with HEAD). A
repo, revision or file that does not exist, or a gated or private repo without a token, is a
``StageRefused`` whose message says what to do (``hub_refusal``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from django.conf import settings

from jobs.models import Job
from nomadgpu import team_secrets

TOKEN_SECRET = "HF_TOKEN"


class StageRefused(Exception):
    """An entry that cannot be staged as given (it does not exist, or needs a token); the
    message says what is wrong and what to do."""


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


def hf_endpoint() -> str:
    return settings.HF_ENDPOINT.rstrip("/")


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


def hf_token(job: Job) -> str | None:
    """The value of the team's HF_TOKEN secret when the job names it, else None."""
    if TOKEN_SECRET not in (job.secrets or []):
        return None
    return team_secrets.values_for(job.team_id, [TOKEN_SECRET]).get(TOKEN_SECRET)
