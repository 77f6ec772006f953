"""``nomadgpu status`` (the job list, or one job in full) and ``nomadgpu cancel``."""

from __future__ import annotations

import argparse

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_OK
from nomadgpu_cli.render import cost_text, duration, loss, money, progress_bar


def cmd_status(api: Api, args: argparse.Namespace) -> int:
    if args.job is None:
        jobs = api.get("/jobs/", team=args.team, state=args.state)
        print(
            f"{'ID':>5}  {'TEAM':<12} {'NAME':<24} {'STATE':<13} {'STEP':>11} {'ETA':>10} "
            f"{'COST':>10} {'':<8}  {'GPU':<14} INT"
        )
        for j in jobs:
            step = f"{j['step'] if j['step'] is not None else '-'}/{j['total_steps'] or '?'}"
            print(
                f"{j['id']:>5}  {j['team'][:12]:<12} {j['name'][:24]:<24} {j['state']:<13} "
                f"{step:>11} {duration(j['eta_s']):>10} {money(j['cost_usd']):>10} "
                f"{j['cost_basis']:<8}  "
                f"{j['gpu_name'][:14]:<14} {j['interruptions']}"
            )
        return EXIT_OK
    job = api.get(f"/jobs/{args.job}")
    print_job(job)
    return EXIT_OK


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
        back = i["running_again_at"] or "not yet"
        note = f"; {i['resume_note']}" if i.get("resume_note") else ""
        print(
            f"{'':>16}attempt {i['attempt']}: {i['cause']} detected {i['detected_at']}, "
            f"running again {back}, resumed from step {i['resumed_step']}{note}"
        )


def cmd_cancel(api: Api, args: argparse.Namespace) -> int:
    job = api.post(f"/jobs/{args.job}/cancel")
    print(f"job {job['id']} {job['state']}")
    return EXIT_OK
