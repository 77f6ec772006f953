"""Hedged rents: one rent creates k >= 2 instances on different machines, keeps the first whose
agent registers and destroys the rest at once (docs/renting-and-recovery.md, "Hedged rents").

Three files: ``race`` (this one) decides how many; ``race_start`` creates the racers;
``race_end`` is the win, and the creates the watchdog settles.

1. **How many** (``plan_for``): ``hosts.selection.race.plan_race`` on the ranked candidates,
   one per machine, each with its chance of failing to start (``start_failure_chance``), its
   time to ready and the job's ``race`` setting. The decision and its numbers are stored on the
   attempt (``decision["race"]``), k = 1 included ("racing would not pay").
2. **The racers** (``race_start.start_race``): each in rank order gets a ``Racer`` row with its
   own label (``ngpu:<env>:<job>:<attempt>.<k>``) and agent token, committed together with its
   offer's claim (``offer_claims``: no offer is bought twice) and its budget hold
   (``jobs.spending``: what it costs should it lose) before its create is sent. A create that
   timed out is settled by the racer's label at once (``list_instances(label=...)``), before any
   further create; not found, it stays ``requested`` and the watchdog adopts it by its label, or
   voids it after ``REQUESTED_GRACE_S``. The first racer created opens the race: the attempt is
   ``starting`` with no instance of its own (``lifecycle.mark_rented``).
3. **The win** (``race_end.win``): the first racer whose agent registers
   (``jobs.agent_api.auth``) gets the attempt: its instance, token, rates and moment of create
   become the attempt's, so heartbeats, checkpoints, fencing and billing read one instance per
   attempt as before. The other racers are lost in the same transaction (their tokens die: their
   agents get 410) and destroyed after it commits; the watchdog's pass destroys any that is
   still listed.
4. **Its end otherwise**: the watchdog follows each racer (``jobs.watchdog.races``): one whose
   host fails on its own is failed and its machine avoided; when every racer has failed, the
   attempt is lost, and the same pass plans the next race on the next offers, without backoff.

The chance a start fails (``start_failure_chance``) is the prior from the offer's
``reliability2`` (``selection.race.start_failure_prior``) scaled by how the team's own starts
went in the last 30 days against that prior, with 10 rentals' weight on the prior: the market's
weather as this team meets it. It is the one place a machine's own record (the team's memory of
machines, when it comes) would replace the prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from hosts import selection
from hosts.selection import race as odds
from jobs.models import Attempt, AttemptState, Job, Racer, RacerState
from nomadgpu.humanize import duration, money

# The team's own starts: the last 30 days, weighed against the prior as 10 rentals of it.
START_WINDOW = timedelta(days=30)
PRIOR_RENTALS = 10.0
P_FAIL_MAX = 0.95
# Causes of a start that failed on the host's side (``jobs.watchdog``): what the team's start
# failures count. A cancel, a budget pause or an outbid is not the host failing to start.
START_FAILURE_CAUSES = frozenset(
    {
        "never_registered",
        "start_overdue",  # jobs.watchdog.deadlines.START_OVERDUE: not up by its deadline
        "provider_gone",
        "provider_offline",
        "provider_exited",
        "provider_unknown",
        "provider_stopped",
        "start_failed",
    }
)


# --- How many --------------------------------------------------------------------------------


def start_failures(team_id: int, *, now: datetime) -> tuple[int, int]:
    """(failed, decided) starts of TEAM_ID's rentals in the last ``START_WINDOW``: a plain
    rent's attempt decided when its agent registered or its host failed before that; a racer
    when it won or failed on its own (a racer that lost says nothing of its host)."""
    since = now - START_WINDOW
    plain = Attempt.objects.filter(job__team_id=team_id, raced=0, rented_at__gte=since)
    started = plain.exclude(registered_at=None).count()
    failed = plain.filter(
        registered_at=None, state=AttemptState.ENDED, end_reason__in=START_FAILURE_CAUSES
    ).count()
    raced = Racer.objects.filter(attempt__job__team_id=team_id, rented_at__gte=since)
    started += raced.filter(state=RacerState.WON).count()
    failed += raced.filter(state=RacerState.FAILED).count()
    return failed, started + failed


def start_failure_chance(reliability: float | None, *, failed: int, decided: int) -> float:
    """The chance a rental of a machine with this ``reliability2`` never gets its agent
    registered: the prior (``selection.race.start_failure_prior``) scaled by the team's own
    start failures (FAILED of DECIDED) against the prior for a reliable machine, the prior
    weighing ``PRIOR_RENTALS`` rentals."""
    base = odds.START_FAIL_RELIABLE
    seen = (failed + PRIOR_RENTALS * base) / (decided + PRIOR_RENTALS)
    return min(odds.start_failure_prior(reliability) * seen / base, P_FAIL_MAX)


@dataclass(frozen=True)
class Entry:
    """One offer a race may create on: its ranking (the rental to create), its odds, the image
    pull its rent priced (GB; none on a machine taken to hold the image) and the disk."""

    ranked: selection.Ranked
    contender: odds.Contender
    pull_gb: float
    disk_gb: float


def entries_for(
    job: Job,
    decision: selection.Decision,
    *,
    failed: int,
    decided: int,
    bytes_deadline: bool = True,
) -> list[Entry]:
    """DECISION's candidates a race may take, one per machine, in rank order, each with what
    ``plan_race`` weighs (``selection.race.Contender``). A failed start is known at the start
    deadline the watchdog would hold its host to (``selection.race.start_deadline_s``: its
    image at its advertised link, capped by the job's ``start_timeout_s``), or, without
    BYTES_DEADLINE (a bench's baseline), at that timeout."""
    req, profile = decision.requirements, decision.profile
    seen: set[int] = set()
    found = []
    for ranked in decision.candidates:
        offer = ranked.offer
        if offer.machine_id in seen or not math.isfinite(ranked.expected_total_usd):
            continue
        if offer.machine_id is not None:
            seen.add(offer.machine_id)
        ready = odds.time_to_ready_s(ranked.cost.image_pull_h * 3600)
        pulled_gb = profile.image_gb * (1.0 - ranked.cost.image_cached_chance)
        deadline_s = float(job.start_timeout_s)
        if bytes_deadline and offer.inet_down_mbps:
            deadline_s = odds.start_deadline_s(
                profile.image_gb,
                offer.inet_down_mbps,
                image_held=ranked.cost.image_cached_chance >= 0.5,  # start_deadline.CACHED_AT
                cap_s=deadline_s,
            )
        contender = odds.Contender(
            offer_id=offer.id,
            machine_id=offer.machine_id,
            p_fail=start_failure_chance(offer.reliability, failed=failed, decided=decided),
            ready_s=ready,
            fail_s=odds.failure_known_s(ready, deadline_s=deadline_s),
            usd_per_h=(offer.storage_usd_per_gb_hour or 0.0) * req.disk_gb,
            pull_usd=pulled_gb * (offer.download_usd_per_gb or 0.0),
            total_usd=ranked.expected_total_usd,
        )
        found.append(Entry(ranked, contender, pulled_gb, req.disk_gb))
    return found


def race_setting(job: Job) -> str | int:
    """JOB's ``race`` ("auto", "off" or a number), as ``JobSpec`` stores it."""
    value = (job.race or "auto").strip().lower()
    return int(value) if value.isdigit() else value


def plan_for(
    job: Job, decision: selection.Decision, *, now: datetime
) -> tuple[odds.RacePlan, list[Entry]]:
    """How many instances JOB's rent creates at once, and the offers it may create on."""
    failed, decided = start_failures(job.team_id, now=now)
    entries = entries_for(job, decision, failed=failed, decided=decided)
    plan = odds.plan_race(
        [e.contender for e in entries],
        hour_value_usd=decision.chosen.rental.gpu_usd_per_hour,
        race=race_setting(job),
    )
    return plan, entries


def decision_record(decision: selection.Decision, plan: odds.RacePlan) -> dict:
    """What the attempt stores of its rent: the selection's decision and the race's plan."""
    return {**decision.as_dict(), "race": {**plan.as_dict(), "why": plan_sentence(plan)}}


def plan_sentence(plan: odds.RacePlan) -> str:
    """Why this k, in words: "racing 2 hosts: a host expected in 1 min 52 s instead of 6 min
    alone, worth $0.0246 of waiting at $0.350/h, against $0.00310 of losers and premium"."""
    worth = (
        f"worth {money(plan.saved_usd)} of waiting at {money(plan.hour_value_usd, per_hour=True)}"
        f", against {money(plan.extra_usd)} of losers and premium"
    )
    if plan.k > 1:
        fixed = " (race = N)" if plan.mode == "fixed" else ""
        return (
            f"racing {plan.k} hosts{fixed}: a host expected in {duration(plan.wait_s)} instead "
            f"of {duration(plan.alone_wait_s)} alone, {worth}"
        )
    if plan.mode != "auto":
        return f"renting one host (race = {'off' if plan.mode == 'off' else 1})"
    if len(plan.contenders) < 1 or plan.saved_usd == 0 == plan.extra_usd:
        return "renting one host: no second machine to race"
    return (
        f"renting one host: racing 2 would not pay (a host expected in "
        f"{duration(plan.alone_wait_s)}; {worth})"
    )
