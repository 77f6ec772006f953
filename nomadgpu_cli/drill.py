"""``nomadgpu drill``: destroy the job's host, wait until it trains again elsewhere (its first
step after the loss), and say when it was back on a machine and training again."""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_JOB_FAILED, EXIT_OK, CliError
from nomadgpu_cli.follow import STOPPED, follow_job
from nomadgpu_cli.jobs import recovery_line
from nomadgpu_cli.render import duration


def cmd_drill(api: Api, args: argparse.Namespace) -> int:
    """Destroy the job's host N times, each time waiting until it trains again elsewhere."""
    for n in range(1, args.times + 1):
        wait_running(api, args.job, poll_s=args.poll, timeout_s=args.timeout)
        cursor = api.get(f"/jobs/{args.job}/events", after=0, limit=1000)["cursor"]
        drill = api.post(f"/jobs/{args.job}/drill")
        print(
            f"drill {n}/{args.times}: destroyed instance {drill['instance_id']} "
            f"(attempt {drill['attempt']}){step_words(drill['step'])}"
        )
        code = follow_job(
            api,
            args.job,
            poll_s=args.poll,
            after=cursor,
            until=lambda e: e["kind"] == "running_again",
        )
        if code != EXIT_OK:
            return code
        print(drill_summary(api.get(f"/jobs/{args.job}"), drill))
    return EXIT_OK


def step_words(step: int | None) -> str:
    """Where the destroyed host had got to, as ``jobs.drill.step_words`` says it (the CLI
    installs without the server; tests/test_portal_drill.py holds the two to the same texts)."""
    return " before its first step" if step is None else f" at step {step} (its last heartbeat)"


def wait_running(api: Api, job_id: int, *, poll_s: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        job = api.get(f"/jobs/{job_id}")
        host = job["host"]
        if job["state"] == "running" and host and host["attempt_state"] == "running":
            return
        if job["state"] in STOPPED:
            raise CliError(f"job {job_id} is {job['state']}: nothing to drill", EXIT_JOB_FAILED)
        if time.monotonic() > deadline:
            raise CliError(f"job {job_id} is not running ({job['state']})", EXIT_JOB_FAILED)
        time.sleep(poll_s)


def drill_summary(job: dict, drill: dict) -> str:
    """The drill's recovery as the server measured it: both figures from the loss (the lost
    host's last heartbeat), the numbers the job page and ``status`` show."""
    mine = [i for i in job["interruption_list"] if i["attempt"] == drill["attempt"]]
    if not mine:
        return "no interruption recorded for the destroyed host"
    i = mine[0]
    lost = datetime.fromisoformat(i["lost_at"])
    detected = (datetime.fromisoformat(i["detected_at"]) - lost).total_seconds()
    kept = "recorded as a fire drill" if i.get("drill") else "recorded as a real loss"
    return f"{kept}; detected after {duration(max(detected, 0.0))}; {recovery_line(i)}"
