"""``nomadgpu logs``: the job's log tail, followed with ``--follow`` until the job ends."""

from __future__ import annotations

import argparse
import sys
import time

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_OK
from nomadgpu_cli.follow import ENDED


def cmd_logs(api: Api, args: argparse.Namespace) -> int:
    chunk = api.get(f"/jobs/{args.job}/logs")
    print_lines(chunk)
    if not args.follow:
        if chunk["pending"]:
            print(chunk["pending"])
        return EXIT_OK
    while chunk["state"] not in ENDED:
        time.sleep(args.poll)
        chunk = api.get(f"/jobs/{args.job}/logs", cursor=chunk["cursor"])
        print_lines(chunk)
    return EXIT_OK


def print_lines(chunk: dict) -> None:
    if chunk["gap"]:
        print("[nomadgpu] … lines missed: the log tail moved on faster than it was read")
    attempt = None
    for line in chunk["lines"]:
        if attempt is not None and line["attempt"] != attempt:
            print(f"[nomadgpu] --- host of attempt {line['attempt']} ---")
        attempt = line["attempt"]
        print(line["text"])
    sys.stdout.flush()
