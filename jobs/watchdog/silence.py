"""The silence rule: when a host's silence is its loss, and when it is the supervisor's own.

An agent that cannot reach the agent API looks exactly like a host that died, so the watchdog
asks a second question before it calls silence a loss: did the ingest path work while this
agent was silent? Plain values in, plain verdicts out (the watchdog gathers them once a tick):

- Silence counts from the attempt's last stored beat, or from the end of the newest ingest
  outage if that is later (``silence_started``): a deploy or a database restart that kept every
  heartbeat out for 30 s does not use up anyone's timeout. After an outage an agent gets one
  more interval first (``heartbeat_verdict``): it was backing off (``agent.heartbeat``, at most
  one interval between tries) and tries again only then.
- A silence past its timeout is a loss only if ingest is seen working after the attempt's next
  beat was due (``ingest_worked_after``): another live attempt's beat stored after it, or, when
  no other agent could have beaten, the web's own beacon (``nomadgpu.ingest``). Otherwise the
  verdict is ``HOLD``: the supervisor is the one not hearing (every agent silent together, or
  the web down), and the loss waits.

Why another agent's beat and not the web's beacon whenever other agents run: a proxy, a DNS
name or a certificate between the hosts and the portal can break while the web itself is fine.
A beacon would then call every host lost; a beat from another host proves the path works.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

LOST, NOT_YET, HOLD = "lost", "not yet", "hold"


@dataclass(frozen=True)
class Evidence:
    """What the watchdog knows of its ingest path at one tick.

    WEB_SEEN_AT: the web's last beacon (None: no web ever ran one, so nothing is known and
    silence is judged as it always was). LAST_BEAT_AT: the newest beat stored for any live
    attempt. BEATING: live attempts whose agents registered, so beat. RESUMED_AT: when
    ingest last worked again after an outage. OUTAGE_OPEN: an outage is going on (its
    OPEN_CAUSE and OPEN_SINCE, the last moment ingest was known to work)."""

    web_seen_at: datetime | None
    last_beat_at: datetime | None
    beating: int
    resumed_at: datetime | None = None
    outage_open: bool = False
    open_cause: str = ""
    open_since: datetime | None = None
    # A beacon older than this is the web down, or just back with its outage not yet recorded
    # (``nomadgpu.ingest.gap``); None: no beacon runs, and its age says nothing.
    web_gap: timedelta | None = None


# Nothing known of the ingest path: silence is judged on the stored beats alone.
NO_EVIDENCE = Evidence(web_seen_at=None, last_beat_at=None, beating=0)


@dataclass(frozen=True)
class Verdict:
    """LOST, NOT_YET (look again at RECHECK_AT) or HOLD (the supervisor's own silence)."""

    kind: str
    recheck_at: datetime | None = None


def silence_started(last_heartbeat_at: datetime | None, evidence: Evidence) -> datetime | None:
    """When the attempt's silence began, as far as it can be held against the host."""
    moments = [m for m in (last_heartbeat_at, evidence.resumed_at) if m is not None]
    return max(moments) if moments else None


def ingest_worked_after(
    moment: datetime, evidence: Evidence, *, others_beating: int, now: datetime
) -> bool:
    """Whether ingest is seen working after MOMENT: a beat from another live attempt stored
    after it, or the web's beacon when no other agent beats (OTHERS_BEATING is 0). Never
    while the beacon is late at NOW: just after a database restart another agent's beat can
    land before the web's beacon records the outage, and the outage's end, which the silence
    is counted from, is not known yet."""
    if beacon_late(evidence, now=now):
        return False
    if evidence.last_beat_at is not None and evidence.last_beat_at >= moment:
        return True
    if others_beating > 0:
        return False
    if evidence.web_seen_at is None:
        return not evidence.outage_open  # no beacon: judged as before, unless one is open
    return evidence.web_seen_at >= moment and not evidence.outage_open


def beacon_late(evidence: Evidence, *, now: datetime) -> bool:
    """Whether the web's beacon is older at NOW than an outage's gap (``Evidence.web_gap``)."""
    if evidence.web_seen_at is None or evidence.web_gap is None:
        return False
    return now - evidence.web_seen_at > evidence.web_gap


def heartbeat_verdict(
    *,
    last_heartbeat_at: datetime | None,
    registered_at: datetime | None,
    interval_s: float,
    timeout: timedelta,
    evidence: Evidence,
    others_beating: int,
    now: datetime,
) -> Verdict:
    """Is an attempt whose deadline passed silent for longer than its TIMEOUT because of its
    host (LOST), not yet past it once outages are counted out (NOT_YET), or silent because the
    supervisor cannot hear anyone (HOLD)?"""
    since = silence_started(last_heartbeat_at or registered_at, evidence)
    if since is None:
        return Verdict(LOST)
    if since != (last_heartbeat_at or registered_at):
        # Silent since before the outage: its agent retries at most one interval after the
        # path returned (its backoff's cap), and then its beat is a request to a web that has
        # just started. Without this a healthy agent on a loaded host, or a web process
        # still warming up, could be called lost right after the outage.
        since += timedelta(seconds=interval_s)
    if since + timeout > now:
        return Verdict(NOT_YET, recheck_at=since + timeout)
    next_beat_due = since + timedelta(seconds=interval_s)
    if ingest_worked_after(next_beat_due, evidence, others_beating=others_beating, now=now):
        return Verdict(LOST)
    return Verdict(HOLD)


def start_verdict(
    *, rented_at: datetime | None, start_timeout_s: float, evidence: Evidence, now: datetime
) -> Verdict:
    """The same question for an agent that never registered within START_TIMEOUT_S of its
    rent: an outage of the agent API since then is not the host's fault either."""
    since = silence_started(rented_at, evidence)
    if since is None:
        return Verdict(LOST)  # its stored deadline passed, and nothing else is known
    deadline = since + timedelta(seconds=start_timeout_s)
    if deadline > now:
        return Verdict(NOT_YET, recheck_at=deadline)
    if ingest_worked_after(deadline, evidence, others_beating=0, now=now):
        return Verdict(LOST)
    return Verdict(HOLD)


def reported_since_outage(last_heartbeat_at: datetime | None, evidence: Evidence) -> bool:
    """Whether the attempt has spoken since the newest outage ended: what it reported before
    (its step, its progress) is stale, so the stall rule must not judge it yet."""
    if evidence.resumed_at is None:
        return True
    return last_heartbeat_at is not None and last_heartbeat_at >= evidence.resumed_at
