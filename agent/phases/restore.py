"""The restore phase: the checkpoint to resume from, downloaded and unpacked into
``<checkpoint dir>/resume-<step>``, or found on this disk already (a container restarted on
the disk its host kept). Its two boundaries, downloaded and unpacked, come back as moments for
the agent's PhaseClock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import checkpoints as ck
from agent.phases.downloads import Downloads

log = logging.getLogger("agent")


@dataclass(frozen=True)
class Restored:
    path: Path  # NOMAD_RESUME_FROM
    downloaded_at: float  # time.monotonic() of the last byte
    unpacked_at: float


def restore_checkpoint(
    resume: dict[str, Any],
    *,
    data_key: bytes | None,
    checkpoint_dir: Path,
    downloads: Downloads,
) -> Restored:
    """Register's RESUME (its checkpoint id, step and object) into CHECKPOINT_DIR, decrypted
    with DATA_KEY when it is encrypted. RestoreError or UnsafeArchive when it cannot be."""
    step = int(resume["step"])
    if resume.get("encrypted") and data_key is None:
        raise ck.RestoreError("the checkpoint is encrypted but no key was given")
    plain_sha = None if resume.get("encrypted") else resume["object"].get("sha256")
    local = ck.local_copy(checkpoint_dir, resume.get("checkpoint_id"), step, sha256=plain_sha)
    if local is not None:
        return _resume_from_disk(step, local)
    download = checkpoint_dir / f".resume-{step}.download"
    target = checkpoint_dir / f"resume-{step}"
    key = data_key if resume.get("encrypted") else None
    log.info("restoring checkpoint step %d (%s bytes)", step, resume["object"]["size"])
    # Downloads over parallel ranged GETs and unpacks as the bytes arrive; only a failed
    # download or sha256 is worth another try, not an unpack of good bytes.
    stats = downloads.retried(
        "checkpoint",
        lambda: ck.restore(
            downloads.storage, resume["object"], target, scratch=download, data_key=key,
            counter=downloads.counter,
        ),
    )  # fmt: skip
    ck.mark_restored(target, resume.get("checkpoint_id"))
    done = time.monotonic()
    restored = Restored(target, done - (stats.total_s - stats.download_s), done)
    log.info(
        "restored checkpoint step %d into %s in %.1f s (download %.1f s, %d connection(s))",
        step,
        target,
        stats.total_s,
        stats.download_s,
        stats.connections,
    )
    return restored


def _resume_from_disk(step: int, local: Path) -> Restored:
    """The checkpoint to resume from is already on this disk (the container restarted
    after its host rebooted, and Vast kept the disk): resume from it, downloading nothing;
    the restore's phase takes no time."""
    log.info("checkpoint step %d is already on this disk (%s): not downloading it", step, local)
    done = time.monotonic()
    return Restored(local, done, done)
