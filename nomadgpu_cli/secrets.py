"""``nomadgpu secret set|list|delete``: the team's secrets through the member API (team admins).

A value never comes from the command line, where the shell's history and ``ps`` would keep it:
``set`` reads it from stdin when stdin is not a terminal (``echo "$HF_TOKEN" | nomadgpu secret
set HF_TOKEN``, ``nomadgpu secret set DEPLOY_KEY < id_ed25519``), else asks for it without
echoing it (``getpass``). A one-line value loses the newline ``echo`` adds; a value of several
lines (a PEM key) is sent exactly as read. ``list`` shows names and when each was last set;
nothing ever prints a value.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import urllib.parse
from typing import TextIO

from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_OK, EXIT_REFUSED, CliError


def choose_team(api: Api, slug: str | None) -> str:
    """SLUG, else the caller's only team; a member of several must pass ``--team``."""
    if slug:
        return slug
    teams = api.get("/teams/")
    if len(teams) == 1:
        return teams[0]["slug"]
    if not teams:
        raise CliError("you belong to no team", EXIT_REFUSED)
    names = ", ".join(t["slug"] for t in teams)
    raise CliError(f"you belong to several teams ({names}): pass --team", EXIT_REFUSED)


def secret_path(team: str, name: str) -> str:
    """The API path of secret NAME of TEAM, each quoted whole (the server checks the name)."""
    quote = urllib.parse.quote
    return f"/teams/{quote(team, safe='')}/secrets/{quote(name, safe='')}"


def read_value(name: str, stdin: TextIO | None = None) -> str:
    """The value of secret NAME: stdin when it is piped or redirected, else a hidden prompt."""
    stdin = stdin or sys.stdin
    if stdin.isatty():
        value = getpass.getpass(f"Value of {name} (not shown): ")
    else:
        value = stdin.read()
        if "\n" not in value.rstrip("\r\n"):  # one line: the newline is echo's, not the value's
            value = value.rstrip("\r\n")
    if not value.strip():
        raise CliError(f"no value given for {name}: nothing was saved", EXIT_REFUSED)
    return value


def cmd_secret_set(api: Api, args: argparse.Namespace) -> int:
    team = choose_team(api, args.team)
    value = read_value(args.name)
    saved = api.put(secret_path(team, args.name), {"value": value})
    done = "added" if saved["created"] else "replaced"
    print(f"secret {saved['name']} {done} in {team}; its value is never shown again")
    if saved.get("note"):
        print(f"note: {saved['note']}")
    return EXIT_OK


def cmd_secret_list(api: Api, args: argparse.Namespace) -> int:
    team = choose_team(api, args.team)
    rows = api.get(f"/teams/{urllib.parse.quote(team, safe='')}/secrets")
    if not rows:
        print(f"team {team} has no secrets")
        return EXIT_OK
    width = max(len("NAME"), *(len(r["name"]) for r in rows))
    print(f"{'NAME':<{width}}  LAST SET")
    for row in rows:
        print(f"{row['name']:<{width}}  {row['updated_at']}")
    return EXIT_OK


def cmd_secret_delete(api: Api, args: argparse.Namespace) -> int:
    team = choose_team(api, args.team)
    api.delete(secret_path(team, args.name))
    print(f"secret {args.name} deleted from {team}; a job naming it no longer gets it")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``secret set NAME``, ``secret list``, ``secret delete NAME``; no argument takes a value."""
    s = sub.add_parser("secret", help="the team's secrets: set, list, delete (team admins)")
    actions = s.add_subparsers(dest="action", required=True)
    a = actions.add_parser(
        "set", help="add or replace a secret; the value from stdin, else a hidden prompt"
    )
    a.add_argument("name", help="an environment variable name, e.g. HF_TOKEN")
    a.set_defaults(run=cmd_secret_set)
    a = actions.add_parser("list", help="the names and when each was last set (never values)")
    a.set_defaults(run=cmd_secret_list)
    a = actions.add_parser("delete", help="delete a secret by name")
    a.add_argument("name")
    a.set_defaults(run=cmd_secret_delete)
    for action in actions.choices.values():
        action.add_argument("--team", help="team slug (needed when you belong to several)")
