"""Staged model files (PROTOCOL.md §5, "stage"): downloaded from the team's storage with the
restore's parallel ranged GETs (``checkpoints.fetch_file``) and laid out where the command
finds them without any network:

- a Hugging Face repo in the Hub's cache layout, as ``huggingface_hub.file_download`` writes it,
  under ``$HF_HOME/hub/models--ORG--NAME/``: ``blobs/<etag>`` (an LFS file's sha256, else its
  git blob id), ``snapshots/<commit>/<path>`` relative symlinks to the blobs, and
  ``refs/<revision>`` holding the commit; the command then runs with ``HF_HUB_OFFLINE=1``, so
  ``from_pretrained("ORG/NAME", revision=...)`` reads it from there;
- a URL entry at ``$NOMAD_STAGE_DIR/<path>``.

A file already in place at its size (an agent restarted in the same container) is not fetched
again.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent import checkpoints as ck

_BLOB = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class StagedFile:
    path: str
    etag: str
    size: int  # plain bytes (what lands on disk)
    object: dict[str, Any] = field(repr=False)  # {url, size, sha256} of the stored bytes


@dataclass(frozen=True)
class StageEntry:
    kind: str  # "hf" | "url"
    files: tuple[StagedFile, ...]
    repo: str = ""
    revision: str = ""
    commit: str = ""
    data_key: bytes | None = field(default=None, repr=False)


@dataclass
class StageStats:
    files: int = 0  # fetched now
    reused: int = 0  # already in place
    bytes: int = 0  # stored bytes fetched


def parse_stage(raw: Any) -> tuple[StageEntry, ...]:
    """Register's ``stage`` (absent or [] for none); ValueError/KeyError/TypeError when
    malformed."""
    if not raw:
        return ()
    return tuple(_entry(item) for item in raw)


def _entry(raw: dict[str, Any]) -> StageEntry:
    kind = raw["kind"]
    key = raw.get("data_key_b64")
    files = tuple(
        StagedFile(str(f["path"]), str(f.get("etag") or ""), int(f["size"]), dict(f["object"]))
        for f in raw["files"]
    )
    for f in files:
        try:
            ck.member_path(Path("/nonexistent-stage"), f.path)
        except ck.UnsafeArchive as exc:  # an absolute or ".." path: a malformed reply
            raise ValueError(str(exc)) from None
    entry = StageEntry(
        kind=kind,
        files=files,
        repo=str(raw.get("repo") or ""),
        revision=str(raw.get("revision") or ""),
        commit=str(raw.get("commit") or ""),
        data_key=base64.b64decode(key, validate=True) if key else None,
    )
    if kind == "hf" and not (_REPO.match(entry.repo) and _COMMIT.match(entry.commit)):
        raise ValueError(f"stage entry {entry.repo!r}: needs a repo id and a 40-hex commit")
    if kind not in ("hf", "url"):
        raise ValueError(f"unknown stage kind {kind!r}")
    return entry


def repo_folder(hf_home: Path, repo: str) -> Path:
    """``$HF_HOME/hub/models--ORG--NAME``, as ``huggingface_hub`` names a model repo's folder."""
    return hf_home / "hub" / ("models--" + repo.replace("/", "--"))


def lay_out(
    storage: httpx.Client,
    entries: tuple[StageEntry, ...],
    *,
    hf_home: Path,
    stage_dir: Path,
    scratch: Path,
    counter: ck.ByteCounter,
) -> StageStats:
    """Fetch and place every file of ENTRIES (module docstring). DownloadError (worth another
    try) or RestoreError as ``checkpoints.fetch_file``."""
    stats = StageStats()
    for entry in entries:
        if entry.kind == "hf":
            _lay_out_repo(storage, entry, hf_home, scratch, counter, stats)
        else:
            for f in entry.files:
                dest = _inside(stage_dir, f.path)
                _fetch_once(storage, f, dest, entry.data_key, scratch, counter, stats)
    return stats


def _lay_out_repo(storage, entry: StageEntry, hf_home: Path, scratch, counter, stats) -> None:
    folder = repo_folder(hf_home, entry.repo)
    snapshot = folder / "snapshots" / entry.commit
    for f in entry.files:
        blob_name = f.etag if _BLOB.match(f.etag) else f.object["sha256"]
        blob = folder / "blobs" / blob_name
        _fetch_once(storage, f, blob, entry.data_key, scratch, counter, stats)
        link = _inside(snapshot, f.path)
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(blob, link.parent)
        if not (link.is_symlink() and os.readlink(link) == target):
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    if entry.revision and entry.revision != entry.commit:
        ref = _inside(folder / "refs", entry.revision)
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(entry.commit)  # no newline, as huggingface_hub writes it


def _inside(root: Path, relative: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = ck.member_path(root.resolve(), relative)
    if path is None:
        raise ck.UnsafeArchive(f"{relative!r}: not a file path")
    return path


def _fetch_once(storage, f: StagedFile, dest: Path, key, scratch: Path, counter, stats) -> None:
    if dest.is_file() and dest.stat().st_size == f.size:
        stats.reused += 1
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    ck.fetch_file(storage, f.object, dest, scratch=scratch, data_key=key, counter=counter)
    if dest.stat().st_size != f.size:
        dest.unlink()
        raise ck.DownloadError(f"{f.path}: {f.size} bytes expected after decryption")
    stats.files += 1
    stats.bytes += int(f.object["size"])
