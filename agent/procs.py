"""The command's processes beyond its own process group.

``torchrun`` (and ``accelerate launch``, which runs torch's elastic agent) starts every rank in a
session of its own (``start_new_session``), so a signal to the command's process group reaches
the launcher but no rank: a checkpoint request would never arrive, and a launcher killed with
SIGKILL would leave its ranks running on the GPUs. The agent therefore makes itself the
*child subreaper* (Linux ``prctl``): a rank whose launcher died is re-parented to the agent
instead of init, so every process the command started stays a descendant of the agent, and
signals go to each process group among them. The command's processes are told from the agent's
own helpers (nvidia-smi runs in a session of its own too) by a variable of the command's
environment, which every process it starts inherits (torchrun passes its own on to the ranks).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Ask Linux to re-parent our orphaned descendants to us; False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def descendants(root: int, proc: str = "/proc") -> list[int]:
    """The pids below ROOT in the process tree (children, their children, ...), from PROC."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents(proc):
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def with_env(pids: Iterable[int], name: str, value: str, proc: str = "/proc") -> list[int]:
    """Those of PIDS whose environment holds NAME=VALUE (a process whose environment cannot
    be read, gone or a zombie, is left out)."""
    wanted = f"{name}={value}".encode()
    found = []
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def other_groups(pids: Iterable[int], exclude: Iterable[int]) -> set[int]:
    """The process groups of PIDS but those in EXCLUDE (a process already gone is skipped)."""
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    return groups - set(exclude)


def _parents(proc: str) -> Iterable[tuple[int, int]]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[1].isdigit():
            yield int(name), int(fields[1])
