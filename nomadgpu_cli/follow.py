"""Following a job: its events and progress printed until it stops (or an awaited event
comes), and the exit code its end means."""

from __future__ import annotations

import time
from collections.abc import Callable

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_JOB_FAILED, EXIT_OK
from nomadgpu_cli.render import Screen, cost_text, event_line, progress_bar

ENDED = {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_FAILED}
# Not terminal on the server (a raised budget lets it continue), but nothing more will happen
# without a person: a follower stops here.
STOPPED = {**ENDED, "paused_budget": EXIT_JOB_FAILED, "needs_attention": EXIT_JOB_FAILED}


def follow_job(
    api: Api,
    job_id: int,
    *,
    poll_s: float,
    after: int = 0,
    until: Callable[[dict], bool] | None = None,
    screen: Screen | None = None,
) -> int:
    """Print JOB's events and progress until it stops (or UNTIL(event) holds); the exit code."""
    screen = screen or Screen()
    cursor = after
    try:
        while True:
            # The job first, then its events: a stop read here was committed with its event,
            # so the events asked for next include it (read the other way round, a job that
            # finished between the two reads ended the follow without its last event).
            job = api.get(f"/jobs/{job_id}")
            page = api.get(f"/jobs/{job_id}/events", after=cursor)
            for event in page["events"]:
                screen.line(event_line(event))
                if until and until(event):
                    return EXIT_OK
            cursor = page["cursor"]
            screen.progress(progress_bar(job))
            if job["state"] in STOPPED and not page["events"]:
                code = finish(job, screen)
                # waiting for an event that never came (a drill's recovery) is a failure
                return EXIT_JOB_FAILED if until else code
            time.sleep(poll_s)
    finally:
        screen.done()


def finish(job: dict, screen: Screen) -> int:
    code = STOPPED[job["state"]]
    why = f" ({job['failure_reason']})" if job.get("failure_reason") else ""
    screen.line(f"job {job['id']} {job['state']}{why}; cost {cost_text(job)}")
    return code
