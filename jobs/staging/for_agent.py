"""What an agent is told of its job's staged files at register (``stage`` in agent/PROTOCOL.md):
per entry, where its files go and a presigned GET of each stored object.
"""

from __future__ import annotations

from jobs.models import Job, StagedObject
from jobs.staging.stage import READY
from nomadgpu.storage import object_store


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
