"""``nomadgpu status`` (the job list, or one job in full) and ``nomadgpu cancel``."""

from __future__ import annotations

import argparse
from datetime import datetime

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_OK
from nomadgpu_cli.render import ACTIVE, cost_text, duration, loss, money, progress_bar


def cmd_status(api: Api, args: argparse.Namespace) -> int:
    if args.job is None:
        jobs = api.get("/jobs/", team=args.team, state=args.state)  # newest first
        print(
            f"{'ID':>5}  {'SUBMITTED':<16}  {'TEAM':<12} {'NAME':<24} {'STATE':<13} "
            f"{'STEP':>11} {'ETA':>10} {'COST':>10} {'':<15}  {'GPU':<14} INT"
        )
        for j in jobs:
            print(
                f"{j['id']:>5}  {submitted(j):<16}  {j['team'][:12]:<12} {j['name'][:24]:<24} "
                f"{j['state']:<13} {step_text(j):>11} {duration(j['eta_s']):>10} "
                f"{money(j['cost_usd']):>10} {j['cost_basis']:<15}  "
                f"{j['gpu_name'][:14]:<14} {j['interruptions']}"
            )
        return EXIT_OK
    job = api.get(f"/jobs/{args.job}")
    print_job(job)
    return EXIT_OK


def submitted(job: dict) -> str:
    """When JOB was submitted, in this machine's time zone: ``2026-03-02 14:05``."""
    return f"{datetime.fromisoformat(job['created_at']).astimezone():%Y-%m-%d %H:%M}"


def step_text(job: dict) -> str:
    """``150/300``; ``waiting`` before the first step (``-`` where none is coming)."""
    if job["step"] is None:
        return "waiting" if job["state"] in ACTIVE else "-"
    return f"{job['step']}/{job['total_steps'] or '?'}"


def print_job(job: dict) -> None:
    host = job["host"]
    rows = [
        ("job", f"{job['id']} {job['name']} (team {job['team']})"),
        ("state", job["state"] + (f": {job['failure_reason']}" if job["failure_reason"] else "")),
        ("progress", progress_bar(job)),
        ("loss", loss(job["loss"])),
        (
            "cost",
            cost_text(job) + (f", budget {money(job['budget_usd'])}" if job["budget_usd"] else ""),
        ),
        ("breakdown", " · ".join(f"{k} {v}" for k, v in job["cost_breakdown_text"].items())),
        (
            "host",
            "-"
            if host is None
            else f"{host['gpu_name']} instance {host['instance_id']} "
            f"(attempt {host['attempt']}, {host['attempt_state']}, {money(host['dph'])}/h)",
        ),
        ("interruptions", job["interruptions"]),
    ]
    if job.get("stage"):  # staged model files: what the staging does now, or did
        rows.insert(2, ("model files", job["stage"]["text"]))
    for name, value in rows:
        print(f"{name:>14}: {value}")
    for i in job["interruption_list"]:
        print(f"{'':>16}{recovery_line(i)}")


def recovery_line(i: dict) -> str:
    """One interruption with its two figures as the server computed them (from the loss, the
    lost host's last heartbeat): the job page's and the status page's words and numbers."""
    drill = " (fire drill)" if i.get("drill") else ""
    note = f"; {i['resume_note']}" if i.get("resume_note") else ""
    return (
        f"attempt {i['attempt']}: {i['cause']}{drill}, lost {local_time(i['lost_at'])}: "
        f"back on a machine {after(i['back_on_machine_s'])}, "
        f"training again {after(i['training_again_s'])}, "
        f"resumed from step {i['resumed_step']}{note}"
    )


def local_time(moment: str) -> str:
    return f"{datetime.fromisoformat(moment).astimezone():%Y-%m-%d %H:%M:%S}"


def after(seconds: float | None) -> str:
    return "not yet" if seconds is None else f"after {duration(seconds)}"


def cmd_cancel(api: Api, args: argparse.Namespace) -> int:
    job = api.post(f"/jobs/{args.job}/cancel")
    print(f"job {job['id']} {job['state']}")
    return EXIT_OK
