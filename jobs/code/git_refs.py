"""A git workdir's ref resolved to the commit every host checks out, with ``git ls-remote``.

Resolved once, at submit: a branch that moves on while the job runs must not give the
replacement host other code than the first. Nothing is cloned on the server; ``ls-remote``
reads only the refs. A private repository is reached with the team's deploy key, written for
the one call to a 0600 file in a private temporary folder and named in ``GIT_SSH_COMMAND``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

from django.conf import settings

LS_REMOTE_TIMEOUT_S = 30
COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
# ext:: and fd:: run commands of the URL's choosing; a job's URL gets only the network ones
# and file:// (the sandbox's hosts are this machine, so a local repository is reachable).
ALLOWED_PROTOCOLS = "https:http:ssh:git:file"
PEELED = "^{}"


class GitRefError(Exception):
    """The ref cannot be resolved; the message names the repository or the ref."""

    def __init__(self, message: str, *, about: str) -> None:
        super().__init__(message)
        self.about = about  # "url" or "ref": which of the two the message is about


def resolve_ref(url: str, ref: str, *, ssh_key: str | None = None) -> str:
    """The 40-hex commit REF names in the repository at URL (a 40-hex REF is taken as it is).
    Raises GitRefError saying why: unreachable, or no such branch or tag."""
    if COMMIT.fullmatch(ref):
        return ref.lower()
    commit = pick_ref(parse_ls_remote(ls_remote(url, ref, ssh_key=ssh_key)), ref)
    if commit is None:
        raise GitRefError(
            f"{url} has no branch or tag named {ref!r}: give a branch, a tag or a full "
            "40-hex commit",
            about="ref",
        )
    return commit


def parse_ls_remote(text: str) -> dict[str, str]:
    """``git ls-remote`` output as {ref name: commit}."""
    refs: dict[str, str] = {}
    for line in text.splitlines():
        sha, _, name = line.partition("\t")
        if COMMIT.fullmatch(sha) and name:
            refs[name] = sha.lower()
    return refs


def pick_ref(refs: dict[str, str], ref: str) -> str | None:
    """The commit REF means among REFS, in git's own order (gitrevisions: the name itself,
    refs/<name>, refs/tags/<name>, refs/heads/<name>); an annotated tag gives its commit."""
    for name in (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        commit = refs.get(name + PEELED) or refs.get(name)
        if commit:
            return commit
    return None


def ls_remote(url: str, ref: str, *, ssh_key: str | None = None) -> str:
    """The refs of URL that match REF (and its peeled tag), as git prints them."""
    with tempfile.TemporaryDirectory(prefix="nomadgpu-git-") as private:
        command = ["git", "ls-remote", "--", url, ref, ref + PEELED]
        try:
            done = subprocess.run(
                command,
                env=git_env(Path(private), ssh_key),
                capture_output=True,
                text=True,
                timeout=LS_REMOTE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise GitRefError(
                f"{url} did not answer within {LS_REMOTE_TIMEOUT_S} s", about="url"
            ) from None
        except FileNotFoundError:
            raise GitRefError("git is not installed on the NomadGPU server", about="url") from None
    if done.returncode != 0:
        raise GitRefError(f"cannot read {url}: {_last_line(done.stderr)}", about="url")
    return done.stdout


def git_env(private: Path, ssh_key: str | None) -> dict[str, str]:
    """The environment of one git call: no prompt (a password prompt would hang the request),
    only the allowed protocols, and the deploy key when there is one."""
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
    }
    if ssh_key:
        env["GIT_SSH_COMMAND"] = _ssh_command(_key_file(private, ssh_key))
    return env


def _key_file(private: Path, ssh_key: str) -> Path:
    path = private / "deploy_key"
    # Created 0600 from the start: ssh refuses a key others can read, and it must never be.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(ssh_key.strip() + "\n")  # OpenSSH needs the final newline
    return path


def _ssh_command(key: Path) -> str:
    # The first answer from a host is trusted and remembered (as ssh does interactively);
    # the server's own ~/.ssh is neither read nor written.
    known_hosts = settings.VAR_DIR / "git_known_hosts"
    return " ".join(
        [
            "ssh",
            f"-i {shlex.quote(str(key))}",
            "-o IdentitiesOnly=yes",
            "-o BatchMode=yes",
            "-o StrictHostKeyChecking=accept-new",
            f"-o UserKnownHostsFile={shlex.quote(str(known_hosts))}",
        ]
    )


def _last_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("fatal:")]
    return (fatal or lines or ["git failed without saying why"])[0].removeprefix("fatal: ")
