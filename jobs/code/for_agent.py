"""What an agent is told of its job's code at register (``workdir`` in agent/PROTOCOL.md): the
archive to download, or the git commit to check out.
"""

from __future__ import annotations

from jobs.code.packs import READY, PackUnavailable, short
from jobs.models import Job, WorkdirPack
from nomadgpu.models import TeamSecret
from nomadgpu.storage import object_store


def agent_workdir(job: Job) -> dict | None:
    """The ``workdir`` of JOB's register reply: None, the archive to download (a presigned GET
    of the stored object, its stored size and sha256, and the key to decrypt it) or the git
    commit to check out (with the deploy key's value, or null). Packs are looked up in the
    job's own team only. Raises PackUnavailable when the job's pack is no longer recorded."""
    workdir = job.workdir or {}
    if workdir.get("kind") == "archive":
        return _archive_for_agent(job, workdir["sha256"])
    if workdir.get("kind") == "git":
        return {
            "kind": "git",
            "url": workdir["url"],
            "commit": workdir["commit"],
            "ssh_key": _secret_value(job.team_id, workdir.get("deploy_key_secret") or ""),
        }
    return None


def _secret_value(team_id: int, name: str) -> str | None:
    # A secret removed since the submit gives no key: the clone then fails on the host, the
    # job's own error (setup_failed), which names the repository.
    secret = TeamSecret.objects.filter(team_id=team_id, name=name).first() if name else None
    return secret.value if secret is not None else None


def _archive_for_agent(job: Job, sha256: str) -> dict:
    packs = WorkdirPack.objects.select_related("team").filter(
        team_id=job.team_id, sha256=sha256, state=READY
    )
    # The one stored as the job encrypts (submit insists on it); should the job's setting
    # have been edited since, the other one holds the same code and says how to read it.
    pack = min(packs, key=lambda p: p.encrypted != job.encrypt_checkpoints, default=None)
    if pack is None:
        raise PackUnavailable(
            f"the job's code pack {short(sha256)} is no longer stored for its team"
        )
    store = object_store(pack.team)
    if store.head(pack.key) is None:  # one HEAD per register: a host must not fetch nothing
        raise PackUnavailable(f"the job's code pack {short(sha256)} is gone from storage")
    return {
        "kind": "archive",
        "object": {
            "url": store.presign_get(pack.key),
            "size": pack.stored_size,
            "sha256": pack.stored_sha256,
        },
        "encrypted": pack.encrypted,
        "data_key_b64": pack.data_key if pack.encrypted else None,
    }
