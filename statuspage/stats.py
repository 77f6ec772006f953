"""Interruption and recovery numbers for a team's public status page.

Every number on the page, in the JSON, the Atom feed and the badge comes from ``team_status``,
which reads ``jobs.Interruption`` rows (plus the count of jobs running now, the supervisor's
``ServiceHeartbeat`` rows and, for the money, billing's reconciliation). Definitions, also in
``statuspage/README.md``:

- **Window**: the last N calendar days in the team's time zone, today included (so the daily
  bars add up to the total): from local midnight N-1 days ago until now. N is 7, 30 or 90.
- **Interruptions**: rows whose ``detected_at`` falls in the window, fire drills left out (a
  loss the team caused on purpose, ``Interruption.drill``: it stays on the job's timeline).
  *Resumed*, *cancelled before recovery* and *still recovering* count those same interruptions
  (not distinct jobs), so they add up to the total.
- **Back on a machine** and **training again**: ``jobs.recovery_times``, the one definition
  every surface uses: from the loss (the last heartbeat, else the detection) to the
  replacement running, and to the first training step after the loss, over the
  interruptions that reached each. **Detection**: ``last_heartbeat_at`` → ``detected_at``,
  where a heartbeat was ever heard.
- **Recovery phases** (``jobs.anatomy``): each resumed interruption's downtime split into
  detection, renting, provider start-up, agent bootstrap, code (the job's workdir fetched),
  setup, checkpoint download, unpack and first step; median and p90 per phase over the
  interruptions where that phase is known.
- **Money** (``statuspage.costs``): what the window's interruptions cost (steps redone and
  start-ups paid again) and the savings against the team's reference cloud (invoiced where
  the invoice covers a job), as totals: no job, host or price of one.
- **Market weather** (``statuspage.weather``): per GPU model with at least 20 rentals in the
  window, rent → ready (median, p90), the share of decided starts that got ready, and host
  losses per rented hour; no machine, job or price.
- **Percentiles** are nearest-rank: the p-th percentile of n sorted values is the value at
  rank ceil(p·n/100), so every median and p90 is a duration that really happened (for an even
  count the median is the lower of the two middle values).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils.crypto import salted_hmac

from jobs import anatomy, attention
from jobs.models import Interruption, Job, JobState
from jobs.recovery_times import recovery_times
from nomadgpu.health import WATCHDOG, is_fresh, silent_for_s
from nomadgpu.models import IngestOutage, ServiceHeartbeat, Team
from statuspage import costs, weather

WINDOWS = (7, 30, 90)
DEFAULT_WINDOW = 30
INCIDENT_LIMIT = 200  # newest first; a 90-day history longer than this is cut
PROVIDER = "provider"  # written by jobs.watchdog.poll.poll_providers after every poll

CAUSE_LABELS = {
    "provider_gone": "instance vanished at the provider",
    "provider_exited": "instance exited",
    "provider_offline": "host went offline",
    "provider_stopped": "instance stopped by the provider",
    "provider_unknown": "provider lost contact with the host",
    "outbid": "outbid by a higher bid",
    "heartbeat_timeout": "agent heartbeats stopped",
    "gpu_fault": "GPU fault",
    "stalled": "training stalled",
    "never_registered": "agent never started",
    "start_overdue": "host not up by its start deadline",
    "start_stalled": "start-up stalled (code, model or checkpoint download)",
    "start_failed": "host could not start the container",
    "agent_error": "agent error",
    "killed": "training process killed",
}


@dataclass(frozen=True)
class Durations:
    """Seconds from one moment to another over a set of interruptions (nearest-rank)."""

    count: int
    median_s: float | None
    p90_s: float | None


@dataclass(frozen=True)
class PhaseDurations:
    """One recovery phase (``jobs.anatomy.PHASES``) over the window's interruptions."""

    key: str
    label: str
    durations: Durations


@dataclass(frozen=True)
class DayCount:
    day: date  # a calendar day in the team's time zone
    interruptions: int


@dataclass(frozen=True)
class Incident:
    """One interruption as the public sees it: no job, host, command or cost."""

    ref: str  # opaque and stable (an HMAC of the row id), for anchors and feed ids
    cause: str
    cause_label: str
    detected_at: datetime  # in the team's time zone, like the other moments
    lost_at: datetime  # the loss both figures count from (``jobs.recovery_times``)
    back_on_machine_at: datetime | None
    training_again_at: datetime | None
    back_on_machine_s: float | None
    training_again_s: float | None
    resumed_step: int | None
    outcome: str  # "resumed" | "cancelled" | "recovering"


@dataclass(frozen=True)
class Check:
    """One supervisor health signal and when it was last seen. ``ok`` is None where it cannot
    be told: no provider poll recorded recently (the watchdog that polls is not ticking).
    ``silent_s``: how long it has not been seen, once that is too long (else None)."""

    ok: bool | None
    last_seen_at: datetime | None
    silent_s: float | None = None


@dataclass(frozen=True)
class OutageLine:
    """A time the agent API took no heartbeats (``nomadgpu.ingest``), and whether any of the
    team's jobs was declared lost from silence meanwhile (none should be: such losses wait)."""

    cause: str
    started_at: datetime
    ended_at: datetime | None
    seconds: float
    lost_during: int

    @property
    def sentence(self) -> str:
        """'agent API unreachable for 30 s; no job was declared lost'."""
        what = (
            "no agent reached the agent API"
            if self.cause == IngestOutage.AGENTS_SILENT
            else "agent API unreachable"
        )
        if self.ended_at is None:
            return f"{what} for {self.seconds:.0f} s so far; losses from silence wait"
        lost = self.lost_during
        verdict = (
            "no job was declared lost"
            if lost == 0
            else f"{lost} job{'s were' if lost > 1 else ' was'} declared lost"
        )
        return f"{what} for {self.seconds:.0f} s; {verdict}"


@dataclass(frozen=True)
class SupervisorHealth:
    watchdog: Check  # the tick ran within a few intervals
    worker_and_beat: Check  # beat schedules the tick and a worker runs it: a fresh tick is both
    provider: Check  # the last provider poll succeeded, and was recent
    outages: tuple[OutageLine, ...] = ()  # the agent API's outages in the window, newest first
    needs_attention: int = 0  # the team's jobs a person must look at (never named here)


@dataclass(frozen=True)
class WeatherCell:
    """One GPU model's market weather (``weather.ModelWeather``) with its rent → ready
    durations, nearest-rank like every other duration here."""

    model: weather.ModelWeather
    rent_to_ready: Durations


@dataclass(frozen=True)
class TeamStatus:
    team_name: str
    team_slug: str
    time_zone: str
    days: int
    generated_at: datetime
    since: datetime
    interruptions: int
    resumed: int
    cancelled_before_recovery: int
    recovering: int
    back_on_machine: Durations
    training_again: Durations
    detection: Durations
    running_now: int
    recovery_phases: tuple[PhaseDurations, ...]
    daily: tuple[DayCount, ...]
    incidents: tuple[Incident, ...]
    health: SupervisorHealth
    interruption_cost: costs.InterruptionCost
    savings: costs.WindowSavings
    market_weather: tuple[WeatherCell, ...] = ()
    weather_hidden_models: int = 0  # GPU models rented, but fewer than 20 times


def team_status(team: Team, *, now: datetime, days: int = DEFAULT_WINDOW) -> TeamStatus:
    """Every number of TEAM's status page over the last DAYS calendar days, as of NOW."""
    if days not in WINDOWS:
        raise ValueError(f"days must be one of {WINDOWS}")
    tz = ZoneInfo(team.time_zone)
    since = window_start(now, days, tz)
    rows = list(
        Interruption.objects.filter(job__team=team, detected_at__gte=since, detected_at__lte=now)
        .exclude(drill=True)
        .select_related("replacement")
        .order_by("-detected_at", "-pk")
    )
    times = [recovery_times(row) for row in rows]
    return TeamStatus(
        team_name=team.name,
        team_slug=team.slug,
        time_zone=team.time_zone,
        days=days,
        generated_at=now.astimezone(tz),
        since=since,
        interruptions=len(rows),
        resumed=sum(outcome_of(row) == "resumed" for row in rows),
        cancelled_before_recovery=sum(outcome_of(row) == "cancelled" for row in rows),
        recovering=sum(outcome_of(row) == "recovering" for row in rows),
        back_on_machine=seconds_summary([t.back_on_machine_s for t in times]),
        training_again=seconds_summary([t.training_again_s for t in times]),
        detection=durations((row.last_heartbeat_at, row.detected_at) for row in rows),
        running_now=Job.objects.filter(team=team, state=JobState.RUNNING).count(),
        recovery_phases=recovery_phases(rows),
        daily=daily_counts(rows, since=since, now=now, tz=tz),
        incidents=tuple(incident(row, tz) for row in rows[:INCIDENT_LIMIT]),
        health=supervisor_health(now=now, team=team, since=since),
        interruption_cost=costs.interruption_costs(rows),
        savings=costs.window_savings(team, since=since, now=now),
        **market_weather(team, since=since, now=now),
    )


def market_weather(team: Team, *, since: datetime, now: datetime) -> dict:
    """``TeamStatus``'s weather fields: each shown GPU model's cell, and how many are hidden."""
    found = weather.market_weather(team, since=since, now=now)
    cells = tuple(WeatherCell(m, seconds_summary(list(m.ready_s))) for m in found.models)
    return {"market_weather": cells, "weather_hidden_models": found.hidden_models}


def window_start(now: datetime, days: int, tz: ZoneInfo) -> datetime:
    """Local midnight DAYS-1 days before NOW's local date (aware, in TZ).

    Built from the local date, not by subtracting 24 h steps, so a window crossing a DST change
    still starts at midnight."""
    first = now.astimezone(tz).date() - timedelta(days=days - 1)
    return datetime.combine(first, time(0), tzinfo=tz)


def daily_counts(
    rows: list[Interruption], *, since: datetime, now: datetime, tz: ZoneInfo
) -> tuple[DayCount, ...]:
    """Interruptions per local calendar day from SINCE to NOW, days without any included."""
    counts = Counter(row.detected_at.astimezone(tz).date() for row in rows)
    first, last = since.date(), now.astimezone(tz).date()
    span = (last - first).days + 1
    return tuple(
        DayCount(day, counts.get(day, 0))
        for day in (first + timedelta(days=i) for i in range(span))
    )


def outcome_of(row: Interruption) -> str:
    """resumed (training ran again), cancelled (before it did), or still recovering."""
    if row.running_again_at is not None:
        return "resumed"
    if row.cancelled_before_recovery:
        return "cancelled"
    return "recovering"


def durations(pairs) -> Durations:
    """Median and p90 of END - START in seconds over the pairs where both are known."""
    seconds = [(end - start).total_seconds() for start, end in pairs if start and end]
    return Durations(
        count=len(seconds),
        median_s=nearest_rank(seconds, 50),
        p90_s=nearest_rank(seconds, 90),
    )


def recovery_phases(rows: list[Interruption]) -> tuple[PhaseDurations, ...]:
    """Median and p90 of every recovery phase over ROWS (each where it is known)."""
    splits = [anatomy.breakdown(row)["phases"] for row in rows]
    return tuple(
        PhaseDurations(key, label, seconds_summary([s[key] for s in splits]))
        for key, label in anatomy.PHASES
    )


def seconds_summary(values: list[float | None]) -> Durations:
    known = [v for v in values if v is not None]
    return Durations(len(known), nearest_rank(known, 50), nearest_rank(known, 90))


def nearest_rank(values: list[float], percent: int) -> float | None:
    """The PERCENT-th percentile by nearest rank: the value at rank ceil(percent·n/100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = -(-percent * len(ordered) // 100)  # integer ceiling: no float rounding at n=10, 20…
    return ordered[max(rank, 1) - 1]


def incident(row: Interruption, tz: ZoneInfo) -> Incident:
    def local(moment: datetime | None) -> datetime | None:
        return moment.astimezone(tz) if moment else None

    times = recovery_times(row)
    return Incident(
        ref=incident_ref(row.pk),
        cause=row.cause,
        cause_label=CAUSE_LABELS.get(row.cause, row.cause.replace("_", " ")),
        detected_at=local(row.detected_at),
        lost_at=local(times.lost_at),
        back_on_machine_at=local(times.back_on_machine_at),
        training_again_at=local(times.training_again_at),
        back_on_machine_s=times.back_on_machine_s,
        training_again_s=times.training_again_s,
        resumed_step=row.resumed_step if row.running_again_at else None,
        outcome=outcome_of(row),
    )


def incident_ref(pk: int) -> str:
    """A stable public id for an interruption that does not reveal the row id or its order."""
    return salted_hmac("statuspage.incident", str(pk)).hexdigest()[:16]


def supervisor_health(
    *, now: datetime, team: Team | None = None, since: datetime | None = None
) -> SupervisorHealth:
    """Is the watchdog ticking (and so beat and a worker alive), and is the provider reachable?
    For TEAM also: the agent API's outages since SINCE, and how many of its jobs need a person
    (stopped for a fault of their own, or failing in the supervisor's newest pass)."""
    beats = {b.name: b for b in ServiceHeartbeat.objects.filter(name__in=[WATCHDOG, PROVIDER])}
    tick = beats.get(WATCHDOG)
    tick_fresh = is_fresh(tick, now, settings.WATCHDOG_INTERVAL_S)
    watchdog = Check(
        ok=tick_fresh,
        last_seen_at=tick.last_seen_at if tick else None,
        silent_s=silent_for_s(tick, now, settings.WATCHDOG_INTERVAL_S),
    )
    poll = beats.get(PROVIDER)
    # A poll runs inside a tick, at most every PROVIDER_POLL_INTERVAL_S.
    poll_every = settings.PROVIDER_POLL_INTERVAL_S + settings.WATCHDOG_INTERVAL_S
    provider_ok = bool(poll.detail.get("ok")) if is_fresh(poll, now, poll_every) else None
    provider = Check(ok=provider_ok, last_seen_at=poll.last_seen_at if poll else None)
    return SupervisorHealth(
        watchdog=watchdog,
        worker_and_beat=watchdog,
        provider=provider,
        outages=outage_lines(team, since=since or now - timedelta(days=1), now=now),
        needs_attention=jobs_needing_attention(team) if team else 0,
    )


OUTAGE_LIMIT = 5


def outage_lines(team: Team | None, *, since: datetime, now: datetime) -> tuple[OutageLine, ...]:
    """The agent API's outages overlapping SINCE..NOW, newest first, with TEAM's jobs declared
    lost from silence during each."""
    rows = IngestOutage.objects.filter(started_at__lte=now).exclude(ended_at__lt=since)
    lines = []
    for row in rows.order_by("-started_at")[:OUTAGE_LIMIT]:
        until = row.ended_at or now
        lost = Interruption.objects.filter(
            cause__in=SILENCE_CAUSES, detected_at__gte=row.started_at, detected_at__lte=until
        ).exclude(drill=True)
        if team is not None:
            lost = lost.filter(job__team=team)
        lines.append(
            OutageLine(
                cause=row.cause,
                started_at=row.started_at,
                ended_at=row.ended_at,
                seconds=(until - row.started_at).total_seconds(),
                lost_during=lost.values("job_id").distinct().count(),
            )
        )
    return tuple(lines)


# The losses an outage of the agent API could have caused: silence, no progress heard, no
# registration heard.
SILENCE_CAUSES = (
    "heartbeat_timeout",
    "stalled",
    "never_registered",
    "start_overdue",
    "start_stalled",
)


def jobs_needing_attention(team: Team) -> int:
    """TEAM's jobs stopped until a person fixes them, or whose row failed the newest pass."""
    failing = set(attention.failed_in_last_pass().get("jobs", []))
    held = set(
        Job.objects.filter(team=team, state=JobState.NEEDS_ATTENTION).values_list("pk", flat=True)
    )
    failing = set(Job.objects.filter(team=team, pk__in=failing).values_list("pk", flat=True))
    return len(held | failing)
