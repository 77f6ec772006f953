"""``nomadgpu secret set|list|delete`` against a live server: the value from stdin or from a
hidden prompt (a real terminal: a pty), never from the command line; names only on the way
back; a member's token refused with who can do it."""

from __future__ import annotations

import io
import os
import pty
import select
import sys
import time

import pytest
from django.utils import timezone

from nomadgpu import api_tokens
from nomadgpu.models import Role, TeamSecret
from nomadgpu_cli import cli
from tests.support.factories import MembershipFactory, TeamSecretFactory
from tests.support.processes import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

HF_TOKEN = "hf_live_0123456789abcdefSECRET"
PEM = "-----BEGIN KEY-----\nAAAA\nBBBB\n-----END KEY-----\n"


def token_of(user) -> str:
    return api_tokens.create_token(user=user, name="cli", now=timezone.now())[1]


@pytest.fixture
def run(live_server, cast, capsys, monkeypatch):
    """The CLI in-process as USER (the admin unless told), stdin as given; (code, out, err)."""

    def run(*argv: str, user=None, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        token = token_of(user or cast.admin)
        code = cli.main(["--url", live_server.url, "--token", token, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def value_of(team, name: str) -> str:
    return TeamSecret.objects.get(team=team, name=name).value


def test_set_reads_a_piped_value_without_echos_newline(run, cast):
    code, out, err = run("secret", "set", "HF_TOKEN", stdin=HF_TOKEN + "\n")

    assert (code, err) == (0, "")
    assert out == "secret HF_TOKEN added in team-a; its value is never shown again\n"
    assert value_of(cast.team_a, "HF_TOKEN") == HF_TOKEN


def test_set_keeps_a_multi_line_value_as_read_and_replaces_by_name(run, cast):
    run("secret", "set", "DEPLOY_KEY", stdin="old-key-value")

    code, out, _ = run("secret", "set", "DEPLOY_KEY", stdin=PEM)

    assert code == 0
    assert out.startswith("secret DEPLOY_KEY replaced in team-a")
    assert value_of(cast.team_a, "DEPLOY_KEY") == PEM


def test_set_asks_for_the_value_on_a_terminal_without_echoing_it(live_server, cast):
    token = token_of(cast.admin)
    argv = [sys.executable, "-m", "nomadgpu_cli", "--url", live_server.url]
    argv += ["secret", "set", "HF_TOKEN"]
    env = {"NOMADGPU_TOKEN": token, "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty
        os.chdir(ROOT)
        os.execve(sys.executable, argv, env)  # noqa: S606 (no shell: the argv as given)

    seen = read_until(fd, b"Value of HF_TOKEN (not shown): ")
    os.write(fd, HF_TOKEN.encode() + b"\n")
    seen += read_until(fd, None)
    _, status = os.waitpid(pid, 0)
    os.close(fd)

    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert HF_TOKEN not in text  # the terminal did not echo it
    assert "secret HF_TOKEN added in team-a" in text
    assert value_of(cast.team_a, "HF_TOKEN") == HF_TOKEN


def read_until(fd: int, marker: bytes | None, timeout: float = 30) -> bytes:
    """What the pty printed until MARKER appeared (None: until the child closed it)."""
    got, deadline = b"", time.monotonic() + timeout
    while marker is None or marker not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"the CLI did not print {marker!r}; it printed {got!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child exited and closed the terminal
            chunk = b""
        if not chunk:
            assert marker is None, f"the CLI ended before printing {marker!r}: {got!r}"
            return got
        got += chunk
    return got


def test_a_value_on_the_command_line_is_refused_and_nothing_saved(run, cast):
    for argv in (("HF_TOKEN", HF_TOKEN), ("HF_TOKEN", "--value", HF_TOKEN)):
        with pytest.raises(SystemExit) as refused:
            run("secret", "set", *argv, stdin="")
        assert refused.value.code == cli.EXIT_REFUSED
    assert not TeamSecret.objects.exists()


def test_an_empty_value_saves_nothing(run, cast):
    code, _, err = run("secret", "set", "HF_TOKEN", stdin="\n")

    assert code == cli.EXIT_REFUSED
    assert err == "nomadgpu: no value given for HF_TOKEN: nothing was saved\n"
    assert not TeamSecret.objects.exists()


def test_a_short_value_is_saved_with_the_servers_note(run, cast):
    code, out, _ = run("secret", "set", "PIN", stdin="abc")

    assert code == 0
    assert "note: the value is shorter than 4 characters: it is stored, but not masked" in out


def test_list_shows_names_and_when_each_was_last_set_never_values(run, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    TeamSecretFactory(team=cast.team_a, name="WANDB_API_KEY", value="wandb-secret-value")

    code, out, _ = run("secret", "list")

    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["NAME", "LAST", "SET"]
    assert [line.split()[0] for line in lines[1:]] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert HF_TOKEN not in out
    assert "wandb-secret-value" not in out


def test_delete_removes_the_name_and_a_second_delete_says_there_is_none(run, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)

    first = run("secret", "delete", "HF_TOKEN")
    second = run("secret", "delete", "HF_TOKEN")

    deleted = "secret HF_TOKEN deleted from team-a; a job naming it no longer gets it\n"
    assert first[:2] == (0, deleted)
    assert second[0] == cli.EXIT_REFUSED
    assert second[2] == "nomadgpu: 404: team team-a has no secret named 'HF_TOKEN'\n"


@pytest.mark.parametrize("argv", [("list",), ("set", "HF_TOKEN"), ("delete", "HF_TOKEN")])
def test_a_members_token_is_refused_with_who_can(run, cast, argv):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)

    code, _, err = run("secret", *argv, user=cast.member, stdin="new-value")

    assert code == cli.EXIT_REFUSED
    assert err == (
        "nomadgpu: 403: only an admin of team Team A can list, set or delete its secrets: "
        "ask alice\n"
    )
    assert value_of(cast.team_a, "HF_TOKEN") == HF_TOKEN


def test_a_member_of_several_teams_names_one(run, cast):
    MembershipFactory(user=cast.admin, team=cast.team_b, role=Role.ADMIN)

    code, _, err = run("secret", "list")
    named = run("secret", "list", "--team", "team-b")

    assert code == cli.EXIT_REFUSED
    assert err == "nomadgpu: you belong to several teams (team-a, team-b): pass --team\n"
    assert named[:2] == (0, "team team-b has no secrets\n")
