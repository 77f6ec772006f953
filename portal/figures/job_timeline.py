"""The job page's timeline: the job's events, oldest first, a lost host's with its
interruption (detection, back on a machine, training again and where that time went), a fire
drill's marked as one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs import anatomy
from jobs.models import Job
from jobs.recovery_times import RecoveryTimes, recovery_times
from nomadgpu.humanize import duration


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    kind: str
    message: str
    interruption: Any = None  # an Interruption for "host lost" entries

    @property
    def label(self) -> str:
        return self.kind.replace("_", " ")

    @property
    def detection_s(self) -> float | None:
        """Seconds from the last heartbeat to the detection of the loss."""
        i = self.interruption
        if i is None or i.last_heartbeat_at is None:
            return None
        return max((i.detected_at - i.last_heartbeat_at).total_seconds(), 0.0)

    @property
    def times(self) -> RecoveryTimes | None:
        """Back on a machine and training again, from the loss (``jobs.recovery_times``)."""
        return None if self.interruption is None else recovery_times(self.interruption)

    @property
    def anatomy(self) -> dict | None:
        """The interruption's downtime by phase (``jobs.anatomy.breakdown``) and its pieces
        as one stacked bar."""
        if self.interruption is None:
            return None
        split = anatomy.breakdown(self.interruption)
        work = split["lost_work"]
        return {
            **split,
            "pieces": anatomy.segments(split["phases"]),
            "caption": f"Where the {duration(split['total_s'])} until training again went",
            "bar_id": f"anatomy-{self.interruption.pk}",
            "gpu_text": duration(work["gpu_s"]),
        }


def timeline(job: Job) -> list[TimelineEntry]:
    """The job's events, oldest first; a host_lost event carries its Interruption (detection
    and recovery times) when one was recorded for that attempt."""
    unmatched = list(job.interruptions.select_related("replacement").order_by("detected_at"))
    out: list[TimelineEntry] = []
    for event in job.events.all():
        found = None
        if event.kind == "host_lost":
            found = _interruption_of(event, unmatched)
            if found is not None:
                unmatched.remove(found)
        out.append(TimelineEntry(event.created_at, event.kind, event.message, found))
    for i in unmatched:  # an interruption whose event is missing still belongs on the timeline
        out.append(TimelineEntry(i.detected_at, "host_lost", f"host lost ({i.cause})", i))
    return sorted(out, key=lambda e: e.at)


def _interruption_of(event, interruptions: list) -> Any:
    """The Interruption a host_lost EVENT reports: its attempt's, when the event names it (a
    host waited for while offline is dated from when it went offline, before its event);
    else the one stamped with the same moment, as handle_loss stamps both."""
    attempt_id = (event.data or {}).get("attempt_id")
    if attempt_id is not None:
        return next((i for i in interruptions if i.attempt_id == attempt_id), None)
    return next((i for i in interruptions if _close(i.detected_at, event.created_at)), None)


def _close(a: datetime, b: datetime) -> bool:
    return abs((a - b).total_seconds()) < 2
