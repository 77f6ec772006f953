"""Code packs and git repositories for the workdir tests, made for real (tarfile, the git CLI)."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

from django.utils import timezone

from jobs.models import WorkdirPack
from nomadgpu import api_tokens

TRAIN_PY = b"print('training on my own code')\n"


def tar_gz(files: dict[str, bytes]) -> bytes:
    """A gzipped tar of FILES (name → content), as the CLI packs a folder."""
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as packed,
        tarfile.open(fileobj=packed, mode="w") as tar,
    ):
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return raw.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_body(data: bytes, *, team: str = "team-a", encrypted: bool = False) -> dict:
    return {"team": team, "sha256": sha256(data), "size": len(data), "encrypted": encrypted}


def bearer(user) -> dict[str, str]:
    _, token = api_tokens.create_token(user=user, name="test", now=timezone.now())
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def ready_pack(team, data: bytes, *, encrypted: bool = False) -> WorkdirPack:
    """A ready plain pack row whose object is stored (through the server's own code)."""
    from jobs.code import packs

    return packs.store_pack(
        team=team, sha256=sha256(data), size=len(data), source=io.BytesIO(data), encrypted=encrypted
    )


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def bare_repository(root: Path) -> tuple[str, dict[str, str]]:
    """A bare repository under ROOT with a main branch of two commits, a feature branch and an
    annotated tag; returns its file:// URL and the commits by name."""
    work = root / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "train.py").write_bytes(TRAIN_PY)
    git("add", "train.py", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    git("tag", "-a", "v1", "-m", "release 1", cwd=work)
    git("branch", "feature", cwd=work)
    (work / "train.py").write_bytes(TRAIN_PY + b"# second\n")
    git("commit", "-q", "-am", "second", cwd=work)
    main = git("rev-parse", "HEAD", cwd=work)
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    return f"file://{root / 'repo.git'}", {"first": first, "main": main}
