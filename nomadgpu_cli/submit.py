"""``nomadgpu submit``: a job file (TOML) or a server template, its code uploaded, and
the job followed with ``--follow``."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_OK, EXIT_REFUSED, CliError
from nomadgpu_cli.follow import follow_job
from nomadgpu_cli.workdir import resolve_workdir

# The server's templates (jobs/job_templates.py JOB_TEMPLATES), for `submit --help`: the CLI
# installs without the server, so it keeps their names; tests/test_cli.py holds the two equal.
TEMPLATES = ("toy", "qlora-tiny", "qlora")


def read_job_file(path: str) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_REFUSED) from exc
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"{path} is not valid TOML: {exc}", EXIT_REFUSED) from exc


def cmd_submit(api: Api, args: argparse.Namespace) -> int:
    if (args.file is None) == (args.template is None):
        raise CliError("give a job file or --template NAME (one of them)", EXIT_REFUSED)
    spec = read_job_file(args.file) if args.file else api.get(f"/jobs/templates/{args.template}")
    if args.team:
        spec["team"] = args.team
    resolve_workdir(api, spec, base=Path(args.file).parent if args.file else Path.cwd())
    job = api.post("/jobs/", spec)
    print(f"submitted job {job['id']} ({job['name']}) to {job['team']}: {job['state']}")
    if not args.follow:
        return EXIT_OK
    return follow_job(api, job["id"], poll_s=args.poll)
