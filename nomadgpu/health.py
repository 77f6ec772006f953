"""Is the supervisor keeping up? One rule, read by the status page and by ``manage.py check``.

The watchdog writes its ``ServiceHeartbeat`` row on every tick (``jobs.watchdog.record_tick``);
a tick older than ``FRESH_INTERVALS`` intervals means beat, the broker or every worker is not
keeping up (one late tick is not an outage).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from nomadgpu.models import ServiceHeartbeat

WATCHDOG = "watchdog"
FRESH_INTERVALS = 3


def is_fresh(beat: ServiceHeartbeat | None, now: datetime, interval_s: float) -> bool:
    """Seen within FRESH_INTERVALS intervals of NOW."""
    if beat is None:
        return False
    return now - beat.last_seen_at <= timedelta(seconds=FRESH_INTERVALS * interval_s)


def silent_for_s(beat: ServiceHeartbeat | None, now: datetime, interval_s: float) -> float | None:
    """Seconds since BEAT was last seen when it is no longer fresh; None while it keeps up or
    has never been seen."""
    if beat is None or is_fresh(beat, now, interval_s):
        return None
    return (now - beat.last_seen_at).total_seconds()


def watchdog_lag_problem(*, now: datetime) -> str | None:
    """'watchdog has not run for N s' when the watchdog fell behind, else None."""
    beat = ServiceHeartbeat.objects.filter(name=WATCHDOG).first()
    silent = silent_for_s(beat, now, settings.WATCHDOG_INTERVAL_S)
    if silent is None:
        return None
    every = settings.WATCHDOG_INTERVAL_S
    return f"watchdog has not run for {silent:.0f} s (it should every {every:g} s)"
