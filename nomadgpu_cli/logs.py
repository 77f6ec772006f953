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
    attempt = print_lines(chunk)
    if not args.follow:
        if chunk["pending"]:
            print(chunk["pending"])
        return EXIT_OK
    while chunk["state"] not in ENDED:
        time.sleep(args.poll)
        chunk = api.get(f"/jobs/{args.job}/logs", cursor=chunk["cursor"])
        attempt = print_lines(chunk, attempt)
    return EXIT_OK


def print_lines(chunk: dict, attempt: int | None = None) -> int | None:
    """Print CHUNK's lines, with a marker wherever the host changed since the last line
    printed (ATTEMPT, the attempt of that line: it carries over from one poll to the next,
    so a change between two polls is marked too); returns the attempt of the last line."""
    if chunk["gap"]:
        print("[nomadgpu] … lines missed: the log tail moved on faster than it was read")
    for line in chunk["lines"]:
        if attempt is not None and line["attempt"] != attempt:
            print(f"[nomadgpu] --- host of attempt {line['attempt']} ---")
        attempt = line["attempt"]
        print(line["text"])
    sys.stdout.flush()
    return attempt
