"""The stage phase: the job's staged model files laid out where the command finds them without
any network (agent.staging says where and how; this phase fetches them, with retries, and logs
what it did). Each file already in place at its size is kept, so an agent restarted in the same
container fetches nothing again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from agent import staging
from agent.phases.downloads import Downloads

log = logging.getLogger("agent")


def fetch_staged(
    stage: tuple[staging.StageEntry, ...],
    *,
    hf_home: Path,
    stage_dir: Path,
    scratch: Path,
    downloads: Downloads,
) -> staging.StageStats:
    """Every file of STAGE into HF_HOME's Hub cache or STAGE_DIR; what was fetched and kept."""
    total = sum(f.size for e in stage for f in e.files)
    log.info("fetching %d staged file(s), %d bytes", sum(len(e.files) for e in stage), total)
    started = time.monotonic()
    stats = downloads.retried(
        "staged files",
        lambda: staging.lay_out(
            downloads.storage, stage, hf_home=hf_home, stage_dir=stage_dir,
            scratch=scratch / ".stage.download", counter=downloads.counter,
        ),
    )  # fmt: skip
    log.info(
        "staged files in place in %.1f s: %d fetched (%d bytes), %d already here",
        time.monotonic() - started,
        stats.files,
        stats.bytes,
        stats.reused,
    )
    return stats


def hf_home(scratch: Path, env: Mapping[str, str]) -> Path:
    """Where the Hub's cache is laid out: the job's own HF_HOME, else the scratch folder's."""
    return Path(env.get("HF_HOME") or scratch / "hf")


def stage_dir(scratch: Path) -> Path:
    return scratch / "stage"
