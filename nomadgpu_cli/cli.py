"""The ``nomadgpu`` command: its arguments and ``main``, which runs one command and returns
its exit code (``errors``); each command lives in its own module (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys

from nomadgpu_cli.api import Api
from nomadgpu_cli.drill import cmd_drill
from nomadgpu_cli.errors import (
    EXIT_AUTH,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CliError,
)
from nomadgpu_cli.jobs import cmd_cancel, cmd_status
from nomadgpu_cli.logs import cmd_logs
from nomadgpu_cli.submit import TEMPLATES, cmd_submit

# The exit codes are re-exported: ``main`` returns them, and its callers read them here.
__all__ = [
    "EXIT_AUTH",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "main",
    "parser",
]

DEFAULT_URL = "http://127.0.0.1:8000"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomadgpu",
        description="Submit and watch NomadGPU jobs through the member API.",
        epilog="Exit codes: 0 ok/succeeded, 1 job failed/cancelled/paused, 2 refused or bad "
        "usage, 3 token not accepted, 4 server unreachable or failing.",
    )
    p.add_argument(
        "--url",
        default=os.environ.get("NOMADGPU_URL", DEFAULT_URL),
        help="portal URL (env NOMADGPU_URL; default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("NOMADGPU_TOKEN"),
        help="personal API token (env NOMADGPU_TOKEN)",
    )
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls when following")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("submit", help="submit a job file (TOML) or a server template")
    s.add_argument("file", nargs="?")
    s.add_argument(
        "--template",
        metavar="NAME",
        help=f"{', '.join(TEMPLATES)}: a template of the server instead of a file",
    )
    s.add_argument("--team", help="team slug (needed when you belong to several)")
    s.add_argument("--follow", "-f", action="store_true", help="show progress and events")
    s.set_defaults(run=cmd_submit)

    s = sub.add_parser("status", help="list jobs, or show one")
    s.add_argument("job", nargs="?", type=int)
    s.add_argument("--team")
    s.add_argument("--state", help="e.g. running or running,recovering")
    s.set_defaults(run=cmd_status)

    s = sub.add_parser("logs", help="the job's log tail")
    s.add_argument("job", type=int)
    s.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    s.set_defaults(run=cmd_logs)

    s = sub.add_parser("cancel", help="cancel a job (its checkpoints are kept)")
    s.add_argument("job", type=int)
    s.set_defaults(run=cmd_cancel)

    s = sub.add_parser("drill", help="fire drill: destroy the job's host (team admins)")
    s.add_argument("job", type=int)
    s.add_argument("--times", type=int, default=1)
    s.add_argument("--timeout", type=float, default=900, help="seconds to wait for running")
    s.set_defaults(run=cmd_drill)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.token:
        print(
            f"nomadgpu: no token: set NOMADGPU_TOKEN or pass --token (create one at "
            f"{args.url.rstrip('/')}/account/tokens/)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    api = Api(args.url, args.token)
    try:
        return args.run(api, args)
    except CliError as exc:
        print(f"nomadgpu: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    finally:
        api.http.close()
