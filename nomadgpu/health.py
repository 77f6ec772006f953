"""Is the supervisor keeping up? One rule, read by the status page and by ``manage.py check``.

The watchdog writes its ``ServiceHeartbeat`` row on every tick
(``jobs.watchdog.passes.record_tick``); a tick older than ``FRESH_INTERVALS`` intervals means
beat, the broker or every worker is not keeping up (one late tick is not an outage).

``manage.py check`` (and ``migrate``, ``runserver`` and each Celery process as they start) says
so (``nomadgpu.W010``) only when it is true that the watchdog *should* be ticking:

- beat, which schedules every tick, records when it starts and when it stops cleanly (the
  ``beat`` row; ``nomadgpu.celery``). Before beat ever started, or after it stopped cleanly,
  nothing is supposed to tick, and a restart of ``make run`` is quiet: the previous beat
  stopped with Ctrl-C, and the new one has not started when ``migrate`` runs.
- While beat is up (started and not stopped since), the watchdog is behind when it has not
  ticked for ``FRESH_INTERVALS`` intervals, counted from its last tick or from beat's start,
  whichever is later: a beat that just started gets the same grace as a late tick.
- A beat that died without stopping (killed, the machine lost) still counts as up: then the
  warning is true too, the supervisor is meant to run and does not.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils.dateparse import parse_datetime

from nomadgpu.models import ServiceHeartbeat

WATCHDOG = "watchdog"
BEAT = "beat"
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


def record_beat_started(*, now: datetime) -> None:
    """Beat is up from NOW: the watchdog should tick from here on."""
    ServiceHeartbeat.objects.update_or_create(
        name=BEAT, defaults={"last_seen_at": now, "detail": {"started_at": now.isoformat()}}
    )


def record_beat_stopped(*, now: datetime) -> None:
    """Beat stopped cleanly at NOW: no tick is due until it starts again."""
    row = ServiceHeartbeat.objects.filter(name=BEAT).first()
    if row is not None:
        row.detail = {**row.detail, "stopped_at": now.isoformat()}
        row.save(update_fields=["detail"])


def beat_up_since(row: ServiceHeartbeat | None) -> datetime | None:
    """When beat last started, if it has not stopped cleanly since; else None."""
    detail = row.detail if row is not None else {}
    started = parse_datetime(detail.get("started_at") or "")
    stopped = parse_datetime(detail.get("stopped_at") or "")
    if started is None or (stopped is not None and stopped >= started):
        return None
    return started


def watchdog_lag_problem(*, now: datetime) -> str | None:
    """'watchdog has not run for N s' when it should be ticking and is behind, else None."""
    rows = {r.name: r for r in ServiceHeartbeat.objects.filter(name__in=[WATCHDOG, BEAT])}
    started = beat_up_since(rows.get(BEAT))
    if started is None:
        return None  # beat is not meant to be running: nothing is due
    tick = rows.get(WATCHDOG)
    last = max(tick.last_seen_at, started) if tick is not None else started
    every = settings.WATCHDOG_INTERVAL_S
    silent = (now - last).total_seconds()
    if silent <= FRESH_INTERVALS * every:
        return None
    if tick is None or tick.last_seen_at < started:
        return (
            f"watchdog has not run for {silent:.0f} s, since beat started (it should every "
            f"{every:g} s)"
        )
    return f"watchdog has not run for {silent:.0f} s (it should every {every:g} s)"
