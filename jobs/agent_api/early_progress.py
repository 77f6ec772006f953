"""The early phases' bytes a heartbeat reports (PROTOCOL.md, heartbeat ``phase_progress``): kept
on the attempt with the link they measure, and the moment the phase under way stalls if no byte
of it moves (``phase_stall.phase_due``), which the heartbeat's deadline never passes.

Only beats that carry them (an agent before its command) pay for this: one read and one write
besides the heartbeat's own two statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs.models import ON_HOST_STATES, Attempt
from jobs.watchdog import phase_stall as ps
from jobs.watchdog import start_deadline as sd
from jobs.watchdog import start_due


@dataclass(frozen=True)
class Early:
    """The early phases after one beat, and when the first of them stalls (None: none can)."""

    progress: ps.EarlyProgress
    due: sd.Due | None


def judge_early(
    attempt: Attempt, reported: Mapping[str, Mapping[str, Any]], *, now: datetime
) -> Early:
    """ATTEMPT's early phases with REPORTED (one beat's ``phase_progress``) added at NOW."""
    row = (
        Attempt.objects.filter(pk=attempt.pk)
        .values_list("start_progress", "decision__chosen__offer__inet_down_mbps")
        .first()
    )
    kept, advertised = row if row is not None else ({}, None)
    stored = ps.EarlyProgress.from_json((kept or {}).get("early"))
    progress = ps.next_progress(stored, reported, now=now)
    advertised = advertised if sd.positive(advertised) else None
    link = start_due.early_link(progress, advertised_mbps=advertised)
    due = ps.phase_due(progress, link, interval_s=attempt.job.heartbeat_interval_s)
    return Early(progress, due)


def store_early(attempt_id: int, early: Early) -> None:
    """Keep EARLY on the attempt: its phases, its stall deadline and why, the link measured."""
    fields: dict[str, Any] = {
        "start_progress": {"early": early.progress.as_json()},
        "start_due_at": early.due.at if early.due else None,
        "start_due_why": early.due.why[:300] if early.due else "",
    }
    if (measured := early.progress.measured_mbps) is not None:
        fields["link_mbps"] = measured
    Attempt.objects.filter(pk=attempt_id, state__in=ON_HOST_STATES).update(**fields)
