"""Jobs on several GPUs of one host: the job's ``launcher`` (``torchrun`` or ``accelerate``)
wrapped around its command, the process counts a user's own launcher line asks for, and which
rank failed, read from the launcher's error summary.

Standard library only: the agent runs it in the job's container, and ``jobs.spec`` checks a
job's command with the same functions at submit, so both read a command alike.

How a command is wrapped (PROTOCOL.md §5 "Launchers"): the command is a Python script (or
``-m module``) and its arguments, optionally after the interpreter that should run it
(``python``, ``python3.11``, ``/opt/conda/bin/python``). The agent replaces that interpreter
word by ``<python> -m torch.distributed.run --standalone --nproc_per_node=<N>`` (torchrun as a
module, so no ``torchrun`` script need be on the PATH) or ``<python> -m accelerate.commands.launch
--num_machines 1 --num_processes <N>`` and runs the result with ``bash -c`` as before, so
``$VARIABLES`` and quoting in the arguments work as they did. ``<python>`` is the interpreter
the command named, else ``python3`` (``python`` where there is no ``python3``).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
from dataclasses import dataclass

TORCHRUN, ACCELERATE = "torchrun", "accelerate"
LAUNCHERS = (TORCHRUN, ACCELERATE)
# A command word that is a Python interpreter: python, python3, python3.11, a path to one.
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# The first shell word of a command as typed: quoted or bare.
_FIRST_WORD = re.compile(r"""^\s*("[^"]*"|'[^']*'|\S+)\s*""")
# Shell words that make a command more than one program and its arguments.
_SHELL_OPERATORS = frozenset({";", "&", "&&", "|", "||", "(", ")", ";;"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# torchrun's --nproc_per_node values that are not a count: it picks the count itself.
_NPROC_WORDS = frozenset({"auto", "gpu", "cpu", "xpu"})


class LaunchError(ValueError):
    """A command that cannot run under the job's launcher, or whose own launcher disagrees
    with the job's GPU count; the message says what to change."""


def is_python(word: str) -> bool:
    """Whether WORD (a command's first word) names a Python interpreter."""
    return bool(_PYTHON.match(os.path.basename(word)))


def check_launched_command(command: str) -> None:
    """Raise LaunchError when COMMAND cannot be given to a launcher: it must be one script (or
    ``-m module``) and its arguments, optionally after a Python interpreter."""
    words = _words(command)
    if not words:
        raise LaunchError("command is empty")
    operators = sorted({w for w in words if w in _SHELL_OPERATORS})
    if operators:
        raise LaunchError(
            f"with a launcher, command is a script and its arguments, without shell operators "
            f"({' '.join(operators)}): move preparation into setup"
        )
    if _ASSIGNMENT.match(words[0]):
        raise LaunchError(
            f"with a launcher, command starts with the script, not {words[0]!r}: "
            "put variables in env"
        )
    own = own_launcher(command)
    if own is not None:
        raise LaunchError(
            f"command already starts {own}, and launcher is set too: "
            "drop launcher, or give command as the script and its arguments"
        )


def wrap_command(command: str, launcher: str, num_gpus: int, *, python: str = "python3") -> str:
    """COMMAND as LAUNCHER starts it with one process per GPU (NUM_GPUS), as bash text.

    PYTHON is the interpreter to use when the command does not name one. The launcher runs
    in place of bash (``exec``), so the agent's signals reach it directly."""
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    first = _FIRST_WORD.match(command)
    rest = command.strip()
    if first is not None and is_python(_unquote(first.group(1))):
        python, rest = _unquote(first.group(1)), command[first.end() :].strip()
    quoted = shlex.quote(python)
    if launcher == TORCHRUN:
        head = f"{quoted} -m torch.distributed.run --standalone --nproc_per_node={num_gpus}"
    else:
        head = f"{quoted} -m accelerate.commands.launch --num_machines 1 --num_processes {num_gpus}"
    return f"exec {head} {rest}"


def own_launcher(command: str) -> str | None:
    """``torchrun`` or ``accelerate launch`` when COMMAND runs one itself (anywhere in it,
    also as ``python -m torch.distributed.run``); else None."""
    words = _words(command)
    for i in range(len(words)):
        kind = _launcher_at(words, i)
        if kind is not None:
            return "accelerate launch" if kind == ACCELERATE else TORCHRUN
    return None


def own_process_count(command: str) -> tuple[str, int] | None:
    """(the flag as written, its count) of the process count a user's own launcher line asks
    for: ``torchrun --nproc_per_node=K`` / ``--nproc-per-node K`` or ``accelerate launch
    --num_processes K``; None without one, or when it lets the launcher count (``auto``)."""
    words = _words(command)
    for i in range(len(words)):
        kind = _launcher_at(words, i)
        if kind is None:
            continue
        names = (
            ("--nproc_per_node", "--nproc-per-node")
            if kind == TORCHRUN
            else ("--num_processes", "--num-processes")
        )
        found = _flag_value(words[i + 1 :], names)
        if found is None:
            return None
        name, value = found
        if value.lower() in _NPROC_WORDS or not value.isdigit():
            return None
        return name, int(value)
    return None


def check_process_count(command: str, num_gpus: int) -> None:
    """Raise LaunchError when COMMAND's own launcher asks for another process count than
    the job's ``requirements.num_gpus``: each process drives one GPU."""
    found = own_process_count(command)
    if found is not None and found[1] != num_gpus:
        name, count = found
        raise LaunchError(
            f"{name.lstrip('-')}={count} but requirements.num_gpus={num_gpus}: make them equal"
        )


def _launcher_at(words: list[str], i: int) -> str | None:
    word = os.path.basename(words[i])
    if word == "torchrun":
        return TORCHRUN
    if word == "accelerate" and words[i + 1 : i + 2] == ["launch"]:
        return ACCELERATE
    if is_python(words[i]) and words[i + 1 : i + 2] == ["-m"]:
        module = words[i + 2] if i + 2 < len(words) else ""
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            return TORCHRUN
        if module == "accelerate.commands.launch":
            return ACCELERATE
    return None


def _flag_value(words: list[str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for j, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in names:
            continue
        if eq:
            return name, value
        if j + 1 < len(words):
            return name, words[j + 1]
    return None


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError as exc:  # an unclosed quote: bash would refuse it too
        raise LaunchError(f"command cannot be read as shell words: {exc}") from exc


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return word[1:-1]
    return word


# --- which rank failed --------------------------------------------------------------------

# torchrun's (and accelerate's, which runs torch's elastic agent) ChildFailedError summary:
#   Root Cause (first observed failure):
#   [0]:
#     ...
#     rank      : 1 (local_rank: 1)
#     exitcode  : 1 (pid: 4242)
_ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M)
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


@dataclass(frozen=True)
class RankFailure:
    """The first rank that failed, as the launcher's summary reports it."""

    rank: int
    local_rank: int
    exitcode: int

    def describe(self) -> str:
        """``rank 1 exited with code 1`` or ``rank 1 was killed by SIGKILL``."""
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            return f"rank {self.rank} was killed by {name}"
        return f"rank {self.rank} exited with code {self.exitcode}"


def failed_rank(output: str) -> RankFailure | None:
    """The root cause in the last launcher error summary of OUTPUT, or None without one."""
    at = output.rfind(_ROOT_CAUSE)
    if at < 0:
        return None
    body = output[at:]
    rank, code = _RANK.search(body), _EXITCODE.search(body)
    if rank is None or code is None:
        return None
    return RankFailure(int(rank.group(1)), int(rank.group(2)), int(code.group(1)))


def rank_lines(output: str, failure: RankFailure, limit: int = 20) -> list[str]:
    """The last LIMIT lines of OUTPUT that the failed rank printed with a rank prefix: torch
    writes a rank's uncaught traceback as ``[rank1]: ...`` (and ``--tee`` its every line as
    ``[default1]: ...``, by local rank). Its unprefixed prints cannot be told from others'."""
    prefixes = (f"[rank{failure.rank}]:", f"[default{failure.local_rank}]:")
    lines = [line for line in output.splitlines() if line.startswith(prefixes)]
    return lines[-limit:]
