"""A host's start deadline on its stored attempt: set at the watchdog's first look after the rent
(``lifecycle.mark_rented`` makes the attempt due at once), pushed later by the provider poll's
news, and judged when due. The decisions are ``jobs.watchdog.start_deadline``'s; this module
reads their inputs from the rows (the stored rent decision, the team's link measured on the
machine, the settings) and writes what they return, so nothing is computed per tick.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

from django.conf import settings

from jobs.models import Attempt, Racer
from jobs.rent_decision import RentDecision
from jobs.spec import ProfileSpec
from jobs.watchdog import phase_stall as ps
from jobs.watchdog import start_deadline as sd

MACHINE_LINKS = 5  # the newest links measured on a machine that count (their median)


def allowances() -> sd.Allowances:
    """Vast's start and the agent's, as configured (``START_PROVISION_S``,
    ``START_BOOTSTRAP_S``); the container's start in ``loading`` is part of Vast's start, so
    never more than it (a sandbox that compresses Vast's minutes compresses it too)."""
    vast = settings.START_PROVISION_S
    return sd.Allowances(
        vast_start_s=vast,
        container_start_s=min(sd.CONTAINER_START_S, vast),
        agent_start_s=settings.START_BOOTSTRAP_S,
    )


def machine_link_mbps(attempt: Attempt, machine_id: int | None = None) -> float | None:
    """The download link the team's agents measured on ATTEMPT's machine (or MACHINE_ID: a
    racer's), the median of its newest ``MACHINE_LINKS``; None where none did."""
    machine_id = attempt.machine_id if machine_id is None else machine_id
    if machine_id is None:
        return None
    found = list(
        Attempt.objects.filter(job__team_id=attempt.job.team_id, machine_id=machine_id)
        .exclude(pk=attempt.pk)
        .exclude(link_mbps=None)
        .order_by("-rented_at")
        .values_list("link_mbps", flat=True)[:MACHINE_LINKS]
    )
    return statistics.median(found) if found else None


def image_gb_of(attempt: Attempt) -> float:
    """The image as the rent priced it; for an instance adopted by its label (no decision), the
    job's profile, else the profile's default."""
    priced = RentDecision.of(attempt).image_gb
    if priced > 0:
        return priced
    profile = attempt.job.profile if isinstance(attempt.job.profile, dict) else {}
    given = profile.get("image_gb")
    if isinstance(given, int | float) and not isinstance(given, bool) and given >= 0:
        return float(given)
    return float(ProfileSpec.model_fields["image_gb"].default)


def plan_for(attempt: Attempt) -> sd.StartPlan | None:
    """What ATTEMPT's start is judged on; None before it is rented."""
    if attempt.rented_at is None:
        return None
    decision = RentDecision.of(attempt)
    return sd.StartPlan(
        rented_at=attempt.rented_at,
        image_gb=image_gb_of(attempt),
        image_held=decision.image_cached_chance >= sd.CACHED_AT,
        link=sd.link_for(machine_link_mbps(attempt), decision.download_mbps),
        start_timeout_s=float(attempt.job.start_timeout_s),
        allowances=allowances(),
    )


def racer_plan(attempt: Attempt, racer: Racer) -> sd.StartPlan | None:
    """What a hedged rent's RACER's start is judged on, as a plain rent of its offer would be:
    its machine's link (measured by the team, else its offer's advertised), whether its
    machine was taken to hold the image (its candidate's ``image_cached_chance``), from its own
    create. None before its create is accepted."""
    if racer.rented_at is None:
        return None
    decision = RentDecision(RentDecision.of(attempt).with_chosen(racer.offer_id))
    return sd.StartPlan(
        rented_at=racer.rented_at,
        image_gb=image_gb_of(attempt),
        image_held=decision.image_cached_chance >= sd.CACHED_AT,
        link=sd.link_for(machine_link_mbps(attempt, racer.machine_id), decision.download_mbps),
        start_timeout_s=float(attempt.job.start_timeout_s),
        allowances=allowances(),
    )


def racer_due(attempt: Attempt, racer: Racer) -> sd.Due | None:
    """RACER's start deadline: the stored one, or, at the first poll that sees its instance,
    the one its plan gives (stored). None before its create is accepted."""
    return _racer_due(attempt, racer)[0]


def _racer_due(attempt: Attempt, racer: Racer) -> tuple[sd.Due | None, sd.StartPlan | None]:
    """``racer_due`` and the plan it was computed from (None when it was stored already)."""
    due = stored(racer, attempt.job)
    if due is not None or racer.rented_at is None:
        return due, None
    plan = racer_plan(attempt, racer)
    if plan is None:
        return None, None
    due = sd.start_due(plan)
    _store_racer(racer, due)
    return due, plan


def note_racer_news(
    attempt: Attempt, racer: Racer, status: str, msg: str, *, now: datetime
) -> sd.Due | None:
    """What the poll saw of RACER's instance (STATUS, MSG, against what the racer holds from the
    poll before) pushes its start deadline later, as ``note_provider_news`` pushes a plain
    rent's; its deadline after the news (None before its create is accepted)."""
    due, plan = _racer_due(attempt, racer)
    if due is None or (status == racer.provider_status and msg == racer.provider_status_msg):
        return due
    plan = plan or racer_plan(attempt, racer)  # one plan per poll: its link is a query
    news = sd.ProviderNews(
        racer.provider_status, racer.provider_status_msg, status, msg, racer.start_pull_seen
    )
    pushed = sd.pushed_start_due(plan, due, news, now=now)
    seen = sd.pull_seen_on_held_image(plan, news)
    if pushed is not None or seen != racer.start_pull_seen:
        _store_racer(racer, pushed or due, pull_seen=seen)
    return pushed or due


def _store_racer(racer: Racer, due: sd.Due, *, pull_seen: bool | None = None) -> None:
    fields: dict = {"start_due_at": due.at, "start_due_why": due.why[:300]}
    if pull_seen is not None:
        fields["start_pull_seen"] = pull_seen
    Racer.objects.filter(pk=racer.pk).update(**fields)
    for name, value in fields.items():
        setattr(racer, name, value)


def race_due(attempt: Attempt, dues: dict[int, sd.Due]) -> None:
    """ATTEMPT's start deadline while it races: the latest of its open racers' DUES (by
    position), with which racer sets it, so that the job page shows when the race runs out and
    the watchdog's deadline pass still ends it if the provider poll, which judges each racer,
    cannot. Stored and the watchdog's next look moved to it; nothing when no racer has one."""
    if not dues:
        return
    position, last = max(dues.items(), key=lambda item: item[1].at)
    racers = f"the last of {len(dues)} racers" if len(dues) > 1 else "its one racer left"
    why = f"{racers}, racer {position}: {last.why}"[:300]
    if (attempt.start_due_at, attempt.start_due_why) == (last.at, why):
        return  # unchanged since the last poll: no write every 10 s per open race
    _store(attempt, sd.Due(last.at, why, last.capped))


def stored_due(attempt: Attempt) -> sd.Due | None:
    """ATTEMPT's start deadline as stored (capped when the user's start timeout set it)."""
    return stored(attempt, attempt.job)


def stored(row: Attempt | Racer, job) -> sd.Due | None:
    """ROW's (an attempt's or a racer's) start deadline as stored, capped when JOB's start
    timeout from ROW's rent set it; None when it has none."""
    if row.start_due_at is None or row.rented_at is None:
        return None
    cap = row.rented_at + timedelta(seconds=job.start_timeout_s)
    return sd.Due(row.start_due_at, row.start_due_why, row.start_due_at >= cap)


def ensure_start_due(
    attempt: Attempt, *, now: datetime, plan: sd.StartPlan | None = None
) -> sd.Due | None:
    """ATTEMPT's start deadline before its agent: the stored one, or, at the first look after
    the rent, the one its plan gives (stored, and the watchdog's next look moved to it). None
    before the rent."""
    due = stored_due(attempt)
    if due is not None or attempt.rented_at is None:
        return due
    if attempt.raced and attempt.instance_id is None:  # racing: its racers' deadlines
        racing = attempt.racers.open().order_by("position")
        dues = {r.position: d for r in racing if (d := racer_due(attempt, r)) is not None}
        if dues:
            race_due(attempt, dues)
            return stored_due(attempt)
    plan = plan or plan_for(attempt)
    if plan is None:
        return None
    due = sd.start_due(plan)
    _store(attempt, due, guard={"start_due_at__isnull": True})
    return due


def note_provider_news(attempt: Attempt, status: str, msg: str, *, now: datetime) -> None:
    """What the poll saw of a host whose agent has not registered (STATUS, MSG, against what
    the attempt holds from the poll before): a new status, or a pull moving, pushes its start
    deadline later (``start_deadline.pushed_start_due``). Nothing is read or written when
    nothing changed."""
    if attempt.registered_at is not None or attempt.rented_at is None:
        return
    if status == attempt.provider_status and msg == attempt.provider_status_msg:
        return
    pull_seen = bool((attempt.start_progress or {}).get("pull_seen"))
    news = sd.ProviderNews(
        attempt.provider_status, attempt.provider_status_msg, status, msg, pull_seen
    )
    plan = plan_for(attempt)
    due = ensure_start_due(attempt, now=now, plan=plan)
    if plan is None or due is None:
        return
    pushed = sd.pushed_start_due(plan, due, news, now=now)
    seen = sd.pull_seen_on_held_image(plan, news)
    if pushed is None and seen == pull_seen:
        return
    _store(attempt, pushed or due, progress={"pull_seen": seen})


def _store(attempt: Attempt, due: sd.Due, *, guard: dict | None = None, progress=None) -> None:
    """DUE on ATTEMPT while its agent has not registered, and the watchdog's next look at it."""
    fields = {"start_due_at": due.at, "start_due_why": due.why[:300], "heartbeat_deadline": due.at}
    if progress is not None:
        fields["start_progress"] = progress
    Attempt.objects.filter(pk=attempt.pk, registered_at__isnull=True, **(guard or {})).update(
        **fields
    )
    for name, value in fields.items():
        setattr(attempt, name, value)


# ---- after register: the early phases --------------------------------------------------------


def early_progress(attempt: Attempt) -> ps.EarlyProgress | None:
    """ATTEMPT's early phases as its heartbeats stored them (None: none reported)."""
    return ps.EarlyProgress.from_json((attempt.start_progress or {}).get("early"))


def early_link(progress: ps.EarlyProgress | None, *, advertised_mbps: float | None) -> sd.Link:
    """The link an early phase is judged at: what this host's phases measured so far, else what
    its offer advertised."""
    measured = progress.measured_mbps if progress is not None else None
    return sd.link_for(measured, advertised_mbps)


def early_stall(attempt: Attempt, *, now: datetime) -> str | None:
    """Why ATTEMPT, registered and still before its command, has an early phase stalled at NOW
    (``phase_stall.stall_detail``), or None when its phase deadline has not passed."""
    due = attempt.start_due_at
    if attempt.phase != "restoring" or due is None or due > now:
        return None
    progress = early_progress(attempt)
    if progress is None:
        return None
    link = early_link(progress, advertised_mbps=RentDecision.of(attempt).download_mbps)
    return ps.stall_detail(progress, link, now=now)
