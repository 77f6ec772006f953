"""Who holds a rent: a claim names the process that made it, so a dead claimer is seen at once.

``jobs.renting.rent.rent`` claims a planned attempt (planned → requested) before it calls Vast. If
the worker dies between the claim and the create (a SIGKILL, an OOM, a host reboot), nothing would
move the attempt until ``REQUESTED_GRACE_S``: five minutes without a host. The claim therefore
records its process (``this_process``: host name, pid and the process's start time, so a reused
pid is not taken for the claimer) and the attempt records when a create was sent
(``create_sent_at``). A claim is known dead (``claim_is_dead``) when

- its process is gone: it ran on this host and that pid no longer runs, or runs another
  program started later (how the watchdog, or the rent task redelivered after
  ``reject_on_worker_lost``, sees a worker on its own host die), or
- the rent task's own time limit passed since the claim (Celery has killed it by then; how a
  claim made on another host is settled).

A dead claim is settled by ``jobs.renting.settle.settle_dead_claim``: no create sent, so nothing can
exist at Vast, and the attempt ends and the job is planned again at once; a create sent, so the
instance is adopted by its label, or, once ``ADOPT_AFTER_S`` passed without one appearing, the
attempt ends too.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings

from jobs.models import Attempt


def process_start(pid: int) -> str:
    """When process PID started, in clock ticks since boot (Linux ``/proc``); '' elsewhere or
    when it does not run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def this_process() -> str:
    """The claim of the calling process: ``host:pid:start``."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start(pid)}"


def claimer_alive(claimed_by: str) -> bool | None:
    """Whether the process of CLAIMED_BY still runs: None when it ran on another host (or the
    claim says nothing), so only its time limit can tell."""
    host, _, rest = claimed_by.partition(":")
    pid_text, _, start = rest.partition(":")
    if not host or host != socket.gethostname() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if start:
        return process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    return True


def task_time_limit() -> timedelta:
    """How long a rent task may run before Celery kills it (``jobs.tasks.VAST_TASK``)."""
    return timedelta(seconds=settings.VAST_TASK_SOFT_LIMIT_S + 30)


def claim_is_dead(attempt: Attempt, *, now: datetime) -> bool:
    """Whether the process that claimed requested ATTEMPT can no longer finish its rent."""
    claimed = attempt.requested_at or attempt.created_at
    if now - claimed > task_time_limit():
        return True
    return claimer_alive(attempt.rent_claimed_by) is False
