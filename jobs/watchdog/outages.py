"""The supervisor's own outages: what a pass knows of the ingest path (the web's beacon, the
newest stored beat) and when silence it holds opens or closes an ``IngestOutage`` for the
status page (``nomadgpu.ingest`` writes the web's side).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Max

from jobs.models import ON_HOST_STATES, Attempt
from jobs.watchdog import silence
from nomadgpu import ingest
from nomadgpu.ingest import beacon_interval_s, read_ingest
from nomadgpu.ingest import gap as ingest_gap
from nomadgpu.models import IngestOutage


def gather_evidence() -> silence.Evidence:
    """What this tick knows of the ingest path: the web's beacon and outages
    (``nomadgpu.ingest``) and the newest beat stored for any live attempt (one query)."""
    ingest = read_ingest()
    beating = Attempt.objects.filter(state__in=ON_HOST_STATES, registered_at__isnull=False)
    seen = beating.order_by().aggregate(last=Max("last_heartbeat_at"), n=Count("id"))
    return silence.Evidence(
        web_seen_at=ingest.web_seen_at,
        last_beat_at=seen["last"],
        beating=seen["n"],
        resumed_at=ingest.resumed_at,
        outage_open=ingest.open is not None,
        open_cause=ingest.open.cause if ingest.open else "",
        open_since=ingest.open.started_at if ingest.open else None,
        web_gap=ingest_gap() if beacon_interval_s() > 0 else None,
    )


def begin_outage(evidence: silence.Evidence, *, now: datetime) -> None:
    """Losses were held: record the outage (once) for the status page, with its cause: the
    web's beacon stopped, or the web is up and no agent gets through."""
    if evidence.outage_open:
        return
    web_down = evidence.web_seen_at is not None and now - evidence.web_seen_at > ingest.gap()
    if web_down:
        ingest.begin_outage(cause=IngestOutage.WEB_DOWN, started_at=evidence.web_seen_at)
    else:
        # The last moment ingest was known to work: a beat, the beacon, or the end of the
        # outage before this one (agents still reconnecting after it must not back-date this
        # one into it).
        known = [m for m in (evidence.last_beat_at, evidence.resumed_at) if m is not None]
        started = max(known) if known else evidence.web_seen_at or now
        ingest.begin_outage(cause=IngestOutage.AGENTS_SILENT, started_at=started)


def end_outage_if_over(evidence: silence.Evidence, *, now: datetime) -> bool:
    """Close the open outage once ingest is seen working again after it began: a beat stored
    after it, the web's beacon again (its own write closes it too, after a longer gap), or no
    agent left to hear from. True when this call closed it."""
    if not evidence.outage_open:
        return False
    since = evidence.open_since
    beat_after = evidence.last_beat_at is not None and evidence.last_beat_at > since
    if evidence.open_cause == IngestOutage.WEB_DOWN:
        over = (evidence.web_seen_at is not None and evidence.web_seen_at > since) or (
            evidence.last_beat_at is not None and evidence.last_beat_at > since + ingest.gap()
        )
    else:
        over = beat_after or evidence.beating == 0
    if over:
        ingest.end_outage(now=now, cause=evidence.open_cause, started_at=since)
    return over
