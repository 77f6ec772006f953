"""The job's own code in the work directory (PROTOCOL.md §5, "Code and setup"): a .tar.gz from
storage (fetched like a checkpoint, see checkpoints.restore) or one git commit, put in place
once per container, and the markers with which a restarted agent skips code and setup that
are already done.

The work directory is ``<scratch>/work`` when the job has code, else the agent's scratch
folder itself (``--workdir``): code replaces its folder whole, which must not take the logs,
progress file and checkpoints with it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent import checkpoints as ck

CODE_DIR = "work"
CODE_MARKER = ".nomad-code"  # in the scratch folder: which code the work directory holds
SETUP_MARKER = ".nomad-setup"  # which setup (for which code) ran to the end in this container
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CodeError(Exception):
    """The job's code cannot be put in place for a reason of the job's own: no git in the
    image, a clone that fails, an archive that is not a safe tar.gz. Reported as
    ``setup_failed``; a host that downloaded damaged bytes raises DownloadError instead."""


@dataclass(frozen=True)
class Code:
    """Register's ``workdir``: an archive in storage or a git commit."""

    kind: str  # "archive" | "git"
    object: dict[str, Any] | None = None  # archive: {url, size, sha256} of the stored bytes
    data_key: bytes | None = None  # archive: set when the pack is ngck1-encrypted
    url: str = ""  # git
    commit: str = ""  # git: 40 hex
    ssh_key: str | None = None  # git: a deploy key's private key text

    @property
    def identity(self) -> str:
        """What the work directory holds, for the markers (no URL that changes per call)."""
        if self.kind == "archive":
            assert self.object is not None
            return f"archive:{self.object['sha256']}"
        return f"git:{self.url}@{self.commit}"


def parse_code(raw: Any) -> Code | None:
    """Register's ``workdir`` (null for none); ValueError/KeyError/TypeError when malformed."""
    if raw is None:
        return None
    if raw.get("kind") == "archive":
        return _parse_archive(raw)
    if raw.get("kind") == "git":
        return _parse_git(raw)
    raise ValueError(f"unknown workdir kind {raw.get('kind')!r}")


def _parse_archive(raw: dict[str, Any]) -> Code:
    obj = raw["object"]
    if not isinstance(obj["url"], str) or not _HEX64.fullmatch(obj["sha256"]):
        raise ValueError("workdir.object needs a url and the sha256 of the stored bytes")
    size = obj["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError("workdir.object.size must be a byte count")
    data_key = None
    if raw.get("encrypted"):
        data_key = base64.b64decode(raw["data_key_b64"], validate=True)
        if len(data_key) != 32:
            raise ValueError("the code pack's data key must be 32 bytes")
    return Code("archive", object=dict(obj), data_key=data_key)


def _parse_git(raw: dict[str, Any]) -> Code:
    url, commit, key = raw["url"], str(raw["commit"]).lower(), raw.get("ssh_key")
    if not isinstance(url, str) or not url.strip():
        raise ValueError("workdir.url must be a clone URL")
    if not _HEX40.fullmatch(commit):
        raise ValueError("workdir.commit must be 40 hex digits")
    if key is not None and not isinstance(key, str):
        raise ValueError("workdir.ssh_key must be text or null")
    return Code("git", url=url, commit=commit, ssh_key=key or None)


def work_directory(scratch: Path, code: Code | None) -> Path:
    """Where the code goes, NOMAD_WORKDIR and the cwd of setup and command (module doc)."""
    return scratch / CODE_DIR if code is not None else scratch


# --- markers ---------------------------------------------------------------------------------


def setup_key(job_id: str, code: Code | None, setup: str) -> str:
    """Names this exact setup text run on this exact code for this job."""
    identity = code.identity if code is not None else None
    return hashlib.sha256(json.dumps([job_id, identity, setup]).encode()).hexdigest()


def marker_matches(path: Path, value: str) -> bool:
    """PATH exists and holds VALUE."""
    try:
        return path.read_text() == value
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return False


def write_marker(path: Path, value: str) -> None:
    """Write VALUE to PATH atomically: a crash leaves the old marker or the new, never half."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(value)
    partial.replace(path)


# --- an archive ------------------------------------------------------------------------------


def fetch_archive(
    storage: httpx.Client, code: Code, target: Path, *, scratch: Path, counter: ck.ByteCounter
) -> ck.RestoreStats:
    """Download the pack (the restore's parallel ranged GETs, size and sha256 of the stored
    bytes checked), decrypt it when it is encrypted and unpack it into a fresh TARGET.

    DownloadError: the bytes did not arrive intact (the host's fault, worth another try);
    CodeError: they did, and they are not a safe tar.gz (the job's own).
    """
    assert code.object is not None
    try:
        return ck.restore(
            storage, code.object, target, scratch=scratch, data_key=code.data_key,
            counter=counter, archive=CODE_ARCHIVE,
        )  # fmt: skip
    except ck.DownloadError:  # a RestoreError too, but the host's fault, not the job's
        raise
    except (ck.RestoreError, ck.UnsafeArchive) as exc:
        raise CodeError(f"the code archive cannot be unpacked: {exc}") from exc


def extract_code(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a code pack into DEST: directories, regular files, hard links to files before
    them, and symbolic links that resolve inside DEST; anything else refuses the archive.

    Members are confined as for checkpoints (no absolute names, no ``..``). Symbolic links are
    made last and then checked as they resolve with all of them in place: a link checked alone
    could be turned outward by a later one (``a -> b/..``, then ``b -> .``), and no file is ever
    written through one.
    """
    root = dest.resolve()
    links: list[tuple[Path, str]] = []
    for member in tar:
        path = ck.member_path(root, member.name)
        if path is None:
            continue  # "." itself
        if member.issym():
            if not member.linkname or os.path.isabs(member.linkname):
                raise ck.UnsafeArchive(f"{member.name!r}: a link must be relative")
            links.append((path, member.linkname))
        elif member.islnk():
            _hard_link(root, member, path)
        elif member.isdir() or member.isreg():
            ck.extract_member(tar, member, path)
        else:
            raise ck.UnsafeArchive(f"{member.name!r}: device files and FIFOs are not allowed")
    _make_links(root, links)


def _hard_link(root: Path, member: tarfile.TarInfo, path: Path) -> None:
    source = ck.member_path(root, member.linkname)
    if source is None or source.is_symlink() or not source.is_file():
        raise ck.UnsafeArchive(f"{member.name!r}: a hard link must name a file before it")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, path)
    except FileExistsError:
        raise ck.UnsafeArchive(f"{member.name!r}: appears twice") from None


def _make_links(root: Path, links: list[tuple[Path, str]]) -> None:
    for path, target in links:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.symlink(target, path)
        except FileExistsError:
            raise ck.UnsafeArchive(f"{path.relative_to(root)}: appears twice") from None
    for path, target in links:
        if os.path.commonpath([root, os.path.realpath(path)]) != str(root):
            raise ck.UnsafeArchive(f"{path.relative_to(root)} -> {target}: leaves the folder")


CODE_ARCHIVE = ck.ArchiveFormat("code archive", compression="gz", extract=extract_code)


# --- a git commit ----------------------------------------------------------------------------

Run = Callable[[str, list[str], Path, Mapping[str, str]], int]


def fetch_git(code: Code, target: Path, *, scratch: Path, env: Mapping[str, str], run: Run) -> None:
    """Check out exactly CODE's commit into a fresh TARGET: ``git init``, a shallow fetch of
    that commit, a detached checkout. RUN(what, argv, cwd, env) runs each git command (its
    output goes to the log tail) and returns its exit status."""
    git = shutil.which("git", path=env.get("PATH"))
    if git is None:
        raise CodeError("git is not installed in the image: use an image with git, or an archive")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with _key_file(code.ssh_key, scratch) as key:
        git_env = {**env, **git_variables(key)}
        for args, doing in _git_steps(code):
            status = run(doing, [git, *args], partial, git_env)
            if status != 0:
                raise CodeError(f"{doing} failed (exit {status}); git's output is in the log tail")
    _check_head(git, partial, code.commit, env)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _git_steps(code: Code) -> list[tuple[list[str], str]]:
    quiet = ["-c", "init.defaultBranch=nomad", "-c", "advice.detachedHead=false"]
    return [
        ([*quiet, "init", "-q"], "git init"),
        (
            [*quiet, "fetch", "--depth", "1", code.url, code.commit],
            f"git fetch of commit {code.commit} from {code.url}",
        ),
        ([*quiet, "checkout", "-q", "--detach", "FETCH_HEAD"], f"git checkout of {code.commit}"),
    ]


def git_variables(key: Path | None) -> dict[str, str]:
    """Git never asks for a password (there is nobody to type one), and with a deploy key it
    uses that key alone and accepts the server's host key the first time it sees it."""
    variables = {"GIT_TERMINAL_PROMPT": "0"}
    if key is not None:
        variables["GIT_SSH_COMMAND"] = (
            f"ssh -i {shlex.quote(str(key))} -o IdentitiesOnly=yes "
            "-o StrictHostKeyChecking=accept-new -o BatchMode=yes"
        )
    return variables


@contextlib.contextmanager
def _key_file(key: str | None, directory: Path) -> Iterator[Path | None]:
    """KEY in a file only we can read (ssh refuses others), deleted when the block ends."""
    if not key:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix=".deploy-key-", dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key if key.endswith("\n") else key + "\n")  # ssh wants the final newline
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _check_head(git: str, folder: Path, commit: str, env: Mapping[str, str]) -> None:
    head = subprocess.run(
        [git, "rev-parse", "HEAD"], cwd=folder, env=dict(env), capture_output=True, text=True
    ).stdout.strip()
    if head != commit:
        raise CodeError(f"git checked out {head or 'nothing'}, not commit {commit}")
