"""The code phase: the job's own code put in the work directory, once per container.

agent.workdir does the work (an archive fetched and unpacked, or one git commit checked out,
and the markers); this phase decides whether it is needed, forgets a setup that ran on older
code, and turns the job's own failures into SetupFailed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from agent import workdir
from agent.phases.command import agent_env
from agent.phases.downloads import Downloads
from agent.phases.setup import SetupFailed

log = logging.getLogger("agent")


def place_code(
    code: workdir.Code | None,
    *,
    target: Path,
    scratch: Path,
    job_env: Mapping[str, str],
    downloads: Downloads,
    run: workdir.Run,
) -> None:
    """CODE into TARGET (unless the scratch folder's marker says it is there): an archive by
    DOWNLOADS, a git commit by RUN with our environment and JOB_ENV (a deploy key's variables
    added). SetupFailed when it is the job's fault; DownloadError when the bytes never came."""
    if code is None:
        return
    marker = scratch / workdir.CODE_MARKER
    if workdir.marker_matches(marker, code.identity) and target.is_dir():
        log.info("the code is already in %s (the agent was restarted)", target)
        return
    for name in (workdir.CODE_MARKER, workdir.SETUP_MARKER):  # setup ran on the old code
        (scratch / name).unlink(missing_ok=True)
    try:
        if code.kind == "archive":
            _fetch_archive(code, target, scratch, downloads)
        else:
            env = {**agent_env(), **job_env}
            workdir.fetch_git(code, target, scratch=scratch, env=env, run=run)
    except workdir.CodeError as exc:
        raise SetupFailed(str(exc)) from exc
    workdir.write_marker(marker, code.identity)
    log.info("code in place in %s", target)


def _fetch_archive(code: workdir.Code, target: Path, scratch: Path, downloads: Downloads) -> None:
    assert code.object is not None
    log.info("fetching the code archive (%s bytes)", code.object["size"])
    download = scratch / ".code.download"
    downloads.retried(
        "code archive",
        lambda: workdir.fetch_archive(
            downloads.storage, code, target, scratch=download, counter=downloads.counter
        ),
    )
