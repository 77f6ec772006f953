"""Resolving a job's ``stage`` entries at their source, before anything is mirrored: a Hugging
Face model repo at a revision (the Hub's commit and files), or one URL (asked with HEAD). A
repo, revision or file that does not exist, or a gated or private repo without a token, is a
``StageRefused`` whose message says what to do (``hub_refusal``); a 5xx or a 429 is a
``SourceUnavailable``, worth another try (``answer_error``; ``trouble`` words the rest and
decides the tries). The messages leave out the entry: ``trouble.entry_label`` leads them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

import httpx
from django.conf import settings

from jobs.models import Job
from nomadgpu import team_secrets

TOKEN_SECRET = "HF_TOKEN"


class StageRefused(Exception):
    """An entry that cannot be staged as given (it does not exist, or needs a token); the
    message says what is wrong and what to do."""


class SourceUnavailable(Exception):
    """The source answered with a fault of its own (5xx) or asked the worker to slow down (429,
    after RETRY_AFTER seconds when it said): another try may succeed."""

    def __init__(self, cause: str, advice: str, retry_after: float | None = None) -> None:
        self.cause, self.advice, self.retry_after = cause, advice, retry_after
        super().__init__(f"{cause}: {advice}")


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
        return f"has no revision {revision!r} ({status}): check the branch, tag or commit"
    if error_code == "EntryNotFound":
        return f"lacks a file it lists at {revision!r} ({status}): check the revision"
    if error_code == "GatedRepo" or (status == 403 and token):
        if token:
            return (
                f"gated, and the team's {TOKEN_SECRET} may not read it ({status}): accept its "
                f"terms at {hf_endpoint()}/{repo} with that token's account"
            )
        return (
            f"gated ({status}): add {TOKEN_SECRET} (a token of an account that accepted its "
            f"terms) to the team's secrets and name it in the job's secrets"
        )
    if error_code == "RepoNotFound" or status in (401, 404):
        if token:
            return (
                f"not found on {hf_endpoint()} ({status}), or {TOKEN_SECRET} may not read it: "
                "check the repo id and revision"
            )
        return (
            f"not found on {hf_endpoint()} ({status}), or private: check the repo id and "
            f"revision; for a private repo add {TOKEN_SECRET} to the team's secrets and name "
            "it in the job's secrets"
        )
    return f"the Hub refused it ({status}): check the entry"


def answer_error(response: httpx.Response, *, refusal: str, source: str) -> Exception:
    """The error for SOURCE's answer RESPONSE that is no success ("the Hub", or a URL's host):
    SourceUnavailable for a fault of its own (5xx) or a 429, else StageRefused with REFUSAL."""
    status = response.status_code
    if status == 429:
        wait = retry_after_s(response.headers.get("Retry-After"))
        asks = f", asking to wait {wait:g} s" if wait is not None else ""
        cause = f"{source} is rate-limiting the worker (429{asks})"
        advice = f"submit the job again in {wait:.0f} s" if wait else "submit the job again later"
        return SourceUnavailable(cause, advice, retry_after=wait)
    if status >= 500:
        cause = f"{source} answered {status}, a fault on its side"
        return SourceUnavailable(cause, "submit the job again later")
    return StageRefused(refusal)


def retry_after_s(header: str | None) -> float | None:
    """A Retry-After header (RFC 9110 §10.2.3: delay-seconds or an HTTP-date) in seconds from
    now, None when absent or unreadable."""
    if not header or not header.strip():
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)  # "-0000": UTC (RFC 5322 §3.3)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


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
        raise _hub_error(response, repo=repo, revision=revision, token=token)
    info = response.json()
    commit = str(info["sha"])
    sizes = {s["rfilename"]: s.get("size") for s in info.get("siblings") or []}
    paths = matching(sizes, globs)
    if not paths:
        wanted = ", ".join(globs) if globs else "any file"
        raise StageRefused(f"has no file matching {wanted} at {revision!r}: check files")
    files = tuple(
        RemoteFile(p, f"{hf_endpoint()}/{repo}/resolve/{commit}/{quote(p)}", sizes[p])
        for p in paths
    )
    # A gated repo's info is public; its files are not. One HEAD finds that out now, before
    # any byte of this or a later entry is mirrored (a 302 is an LFS file's CDN redirect).
    head = client.head(files[0].url, headers=hub_headers(token))
    if head.status_code >= 400:
        raise _hub_error(head, repo=repo, revision=revision, token=token)
    source = source_of("hf", repo=repo, commit=commit, globs=globs)
    return Resolved("hf", source, repo, revision, commit, files)


def resolve_url(client: httpx.Client, entry: dict) -> Resolved:
    """ENTRY's URL, asked with HEAD (a server that does not answer HEAD is tried at download)."""
    url = entry["url"]
    response = client.head(url, follow_redirects=True)
    if response.status_code in (401, 403, 404, 410, 429):
        refusal = f"answered {response.status_code}: check the URL"
        raise answer_error(response, refusal=refusal, source=response.request.url.host)
    length = response.headers.get("Content-Length") if response.status_code == 200 else None
    size = int(length) if length and length.isdigit() else None
    files = (RemoteFile(entry["path"], url, size),)
    return Resolved("url", source_of("url", url=url, path=entry["path"]), "", "", "", files)


def _hub_error(
    response: httpx.Response, *, repo: str, revision: str, token: str | None
) -> Exception:
    code = response.headers.get("X-Error-Code", "")
    refusal = hub_refusal(
        response.status_code, code, repo=repo, revision=revision, token=bool(token)
    )
    return answer_error(response, refusal=refusal, source="the Hub")


def resolve(client: httpx.Client, entry: dict, token: str | None) -> Resolved:
    if "hf" in entry:
        return resolve_hf(client, entry, token)
    return resolve_url(client, entry)


def hf_token(job: Job) -> str | None:
    """The value of the team's HF_TOKEN secret when the job names it, else None."""
    if TOKEN_SECRET not in (job.secrets or []):
        return None
    return team_secrets.values_for(job.team_id, [TOKEN_SECRET]).get(TOKEN_SECRET)
