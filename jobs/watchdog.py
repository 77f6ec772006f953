"""The watchdog: one tick every few seconds (Celery beat) that notices lost hosts.

For now a tick only records that the supervisor loop is alive; the loss conditions arrive with
the supervisor. Every tick is an idempotent reconciler: a duplicate tick only wastes work.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import F

from nomadgpu.models import ServiceHeartbeat

WATCHDOG = "watchdog"


def record_tick(*, now: datetime) -> None:
    """Mark the watchdog alive at NOW (the status page's 'is the watchdog ticking')."""
    updated = ServiceHeartbeat.objects.filter(name=WATCHDOG).update(
        last_seen_at=now, count=F("count") + 1
    )
    if not updated:
        ServiceHeartbeat.objects.get_or_create(
            name=WATCHDOG, defaults={"last_seen_at": now, "count": 1}
        )


def tick(*, now: datetime) -> dict:
    """Run one watchdog pass at NOW and say what it did."""
    record_tick(now=now)
    return {"at": now.isoformat()}
