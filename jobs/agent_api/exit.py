"""What the agent's exit report does: the attempt's last word is kept (its log tail masked
again), and the attempt ends as a finished or failed job, or as a lost host.
"""

from __future__ import annotations

from datetime import datetime

from jobs import lifecycle
from jobs.agent_api.heartbeat_store import LOG_TAIL_LIMIT
from jobs.code import job_secrets
from jobs.models import Attempt


def record_exit(
    attempt: Attempt,
    *,
    exit_code: int | None,
    reason: str,
    log_tail: str,
    now: datetime,
    error: str = "",
) -> None:
    """Keep what the agent said about the end of the training process, then end the attempt
    (success finishes the job, a non-zero exit fails it; see ``lifecycle.handle_exit``). A command
    that never started (``agent_error``) or was killed (``killed``) is a lost host instead; a
    setup that failed (``setup_failed``) is the job's own error, like a failed command.

    The log tail kept here is the attempt's last word (events and notifications quote it), so
    the job's secret values are masked in it again, whatever the agent did."""
    Attempt.objects.filter(pk=attempt.pk).update(
        exit_code=exit_code,
        phase="exited",
        log_tail=job_secrets.mask_for(attempt.job, log_tail[-LOG_TAIL_LIMIT:]),
        last_heartbeat_at=now,
    )
    attempt.refresh_from_db()
    if reason == "agent_error":
        # The command never ran (e.g. the checkpoint failed its sha256 on this host): a host
        # problem, not the user's code, so the job moves to another host.
        lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "agent_error", error), now=now)
        return
    if reason == "killed" and exit_code != 0:
        # The agent was told to terminate (docker stop: outbid, host maintenance, a stop from
        # the provider's console) or the command died from a signal it did not send. The
        # command did not exit on its own, so this is the host's doing, not the user's bug.
        how = f"exit code {exit_code}" if exit_code is not None else "a signal"
        detail = f"the command was stopped by the host ({how})"
        lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "killed", detail), now=now)
        return
    lifecycle.handle_exit(attempt, exit_code=exit_code, reason=reason, now=now, error=error)
