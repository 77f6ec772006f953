"""Is the agent API taking heartbeats? The web process says so itself, so that the watchdog never
takes the supervisor's own outage (a deploy, a crashed gunicorn, a database restart) for the
loss of every host.

Each web process runs a beacon thread (``start_web_beacon``, called by ``nomadgpu.wsgi``) that
writes the ``web`` ``ServiceHeartbeat`` every ``WEB_BEACON_INTERVAL_S``: the agent API is up and
its database answers. The first write after a gap of more than ``GAP_INTERVALS`` intervals
ends the outage: the one the watchdog opened meanwhile is closed, or, when nothing could run
(a database outage stops the watchdog too), a closed one is recorded. The watchdog reads all
this through ``read_ingest`` and counts each attempt's silence from the end of the newest
outage (``jobs.watchdog.silence``). Outages are ``IngestOutage`` rows; the status page lists them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.db.models import F
from django.utils import timezone

from nomadgpu.models import IngestOutage, ServiceHeartbeat

logger = logging.getLogger(__name__)

WEB = "web"
GAP_INTERVALS = 3  # beacon writes missed before the gap is an outage (one late write is not)


def beacon_interval_s() -> float:
    """Seconds between the web's beacon writes; 0 turns the beacon off."""
    return float(settings.WEB_BEACON_INTERVAL_S)


def gap() -> timedelta:
    """A silence of the beacon longer than this is an outage of the agent API."""
    return timedelta(seconds=GAP_INTERVALS * beacon_interval_s())


@dataclass(frozen=True)
class Ingest:
    """What the supervisor knows of its own ingest path at one moment.

    WEB_SEEN_AT is the web's last beacon; None when no web process ever ran one (then nothing
    is known, and the watchdog judges silence as it always did). RESUMED_AT is when ingest
    last worked again after an outage, OPEN the outage still going on, if any."""

    web_seen_at: datetime | None
    resumed_at: datetime | None
    open: IngestOutage | None


def read_ingest() -> Ingest:
    """The web's beacon, the last outage that ended and the one still open: three queries."""
    beacon = ServiceHeartbeat.objects.filter(name=WEB).values_list("last_seen_at", flat=True)
    ended = IngestOutage.objects.exclude(ended_at=None).order_by("-ended_at")
    return Ingest(
        web_seen_at=beacon.first(),
        resumed_at=ended.values_list("ended_at", flat=True).first(),
        open=IngestOutage.objects.filter(ended_at=None).order_by("-started_at").first(),
    )


def note_web_alive(*, now: datetime) -> IngestOutage | None:
    """Write the web's beacon at NOW. When the previous write is older than ``gap()`` the agent
    API was down until now: that outage ends here and is returned."""
    # One transaction: a reader never sees the fresh beacon without the outage it ended.
    with transaction.atomic():
        return _note_web_alive(now)


def _note_web_alive(now: datetime) -> IngestOutage | None:
    previous = ServiceHeartbeat.objects.filter(name=WEB).values_list("last_seen_at", flat=True)
    last = previous.first()
    if last is None:
        ServiceHeartbeat.objects.get_or_create(name=WEB, defaults={"last_seen_at": now, "count": 1})
        return None
    # Compare-and-set on the value read: of several web processes coming back at once, one
    # ends the outage.
    claimed = ServiceHeartbeat.objects.filter(name=WEB, last_seen_at=last).update(
        last_seen_at=now, count=F("count") + 1
    )
    if not claimed or now - last <= gap():
        if not claimed:
            ServiceHeartbeat.objects.filter(name=WEB, last_seen_at__lt=now).update(last_seen_at=now)
        return None
    return end_outage(now=now, cause=IngestOutage.WEB_DOWN, started_at=last)


def end_outage(*, now: datetime, cause: str, started_at: datetime) -> IngestOutage:
    """Ingest works again at NOW: close the open outage, or record the one nobody saw begin
    (CAUSE, from STARTED_AT)."""
    open_outage = IngestOutage.objects.filter(ended_at=None).order_by("-started_at").first()
    if open_outage is not None:
        IngestOutage.objects.filter(ended_at=None).update(ended_at=now)
        open_outage.ended_at = now
        return open_outage
    # The watchdog may be opening this very outage now (the same start): one row either way.
    outage, created = IngestOutage.objects.get_or_create(
        started_at=started_at, defaults={"cause": cause, "ended_at": now}
    )
    if not created and outage.ended_at is None:
        IngestOutage.objects.filter(pk=outage.pk, ended_at=None).update(ended_at=now)
        outage.ended_at = now
    return outage


def begin_outage(*, cause: str, started_at: datetime) -> IngestOutage:
    """The watchdog sees ingest down: the open outage, opened now if none is (idempotent)."""
    open_outage = IngestOutage.objects.filter(ended_at=None).order_by("-started_at").first()
    if open_outage is not None:
        return open_outage
    # The watchdog's evidence may predate the web's record of this very outage (a database
    # restart reconnects both at once): one that ended after STARTED_AT already covers it.
    covering = IngestOutage.objects.filter(ended_at__gt=started_at, started_at__lte=started_at)
    recorded = covering.order_by("-ended_at").first()
    if recorded is not None:
        return recorded
    # get_or_create: the web's beacon may have just recorded it, ended, from the same start.
    outage, created = IngestOutage.objects.get_or_create(
        started_at=started_at, defaults={"cause": cause}
    )
    if created:
        logger.warning("agent API outage (%s) since %s: heartbeat losses wait", cause, started_at)
    return outage


# --- The beacon thread ---------------------------------------------------------------------

_beacon: threading.Thread | None = None
_lock = threading.Lock()


def start_web_beacon() -> bool:
    """Start this process's beacon thread once. False when the beacon is turned off
    (``WEB_BEACON_INTERVAL_S=0``)."""
    global _beacon
    if beacon_interval_s() <= 0:
        return False
    with _lock:
        if _beacon is None or not _beacon.is_alive():
            _beacon = threading.Thread(target=_beat_forever, name="web-beacon", daemon=True)
            _beacon.start()
    return True


def _restart_after_fork() -> None:
    # Threads do not survive a fork: a web process forked from one that beat (gunicorn's
    # --preload) starts its own.
    global _beacon, _lock
    had_one, _beacon, _lock = _beacon is not None, None, threading.Lock()
    if had_one:
        start_web_beacon()


def _beat_forever() -> None:
    failing = False
    while True:
        try:
            note_web_alive(now=timezone.now())
            if failing:
                logger.warning("web beacon: the database answers again")
            failing = False
        except DatabaseError as exc:
            if not failing:  # once per outage: it is retried every interval
                logger.warning("web beacon: cannot reach the database (%s)", exc)
            failing = True
        except Exception:
            logger.exception("web beacon failed; trying again")
        try:
            close_old_connections()  # a broken connection is replaced at the next write
        except Exception:
            logger.exception("web beacon: closing its database connection failed")
        time.sleep(beacon_interval_s())


os.register_at_fork(after_in_child=_restart_after_fork)
