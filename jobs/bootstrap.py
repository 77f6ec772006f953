"""Getting the agent onto a host: the bootstrap script (an instance's ``onstart``) and the
agent itself as one zipapp, built once per code version and served by the web process."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.template.loader import render_to_string

from agent.build import build_zipapp
from jobs.models import Attempt

AGENT_DEPENDENCIES = ("httpx==0.28.1", "cryptography==50.0.2")


def agent_source_digest() -> str:
    """A digest of the agent's source files: the zipapp is rebuilt when it changes."""
    digest = hashlib.sha256()
    root = Path(settings.BASE_DIR) / "agent"
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def agent_zipapp_path() -> Path:
    """The built agent.pyz for the current source (built on first use, then reused).

    No lock: worker processes that race here each build a whole file and rename it into place
    (``build_zipapp``), so the loser's rename replaces identical bytes."""
    out = settings.VAR_DIR / "agent" / f"agent-{agent_source_digest()}.pyz"
    if not out.exists():
        build_zipapp(out)
    return out


@lru_cache(maxsize=8)
def _sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render_bootstrap(attempt: Attempt, *, token: str) -> str:
    """The shell script that installs the agent's two dependencies, fetches it and starts it."""
    zipapp = agent_zipapp_path()
    return render_to_string(
        "jobs/bootstrap.sh",
        {
            "supervisor_url": settings.SITE_URL,
            "token": token,
            "attempt": attempt,
            "dependencies": " ".join(AGENT_DEPENDENCIES),
            "agent_sha256": _sha256_of(zipapp),
        },
    )
