"""Hedged rents: one rent creates k >= 2 instances on different machines, keeps the first whose
agent registers and destroys the rest at once (docs/renting-and-recovery.md, "Hedged rents").

1. **How many** (``plan_for``): ``hosts.selection.race.plan_race`` on the ranked candidates,
   one per machine, each with its chance of failing to start (``start_failure_chance``), its
   time to ready and the job's ``race`` setting. The decision and its numbers are stored on the
   attempt (``decision["race"]``), k = 1 included ("racing would not pay").
2. **The racers** (``start_race``): each in rank order gets a ``Racer`` row with its own label
   (``ngpu:<env>:<job>:<attempt>.<k>``) and agent token, committed together with its offer's
   claim (``offer_claims``: no offer is bought twice) and its budget hold (``jobs.spending``:
   what it costs should it lose) before its create is sent. A create that timed out is settled
   by the racer's label at once (``list_instances(label=...)``), before any further create;
   not found, it stays ``requested`` and the watchdog adopts it by its label, or voids it after
   ``REQUESTED_GRACE_S``. The first racer created opens the race: the attempt is ``starting``
   with no instance of its own (``lifecycle.mark_rented``).
3. **The win** (``win``): the first racer whose agent registers (``jobs.agent_api.auth``) gets
   the attempt: its instance, token, rates and moment of create become the attempt's, so
   heartbeats, checkpoints, fencing and billing read one instance per attempt as before. The
   other racers are lost in the same transaction (their tokens die: their agents get 410) and
   destroyed after it commits; the watchdog's pass destroys any that is still listed.
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

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, F, Max, Value
from django.db.models.functions import Coalesce

from hosts import selection
from hosts.selection import race as odds
from hosts.vast import (
    CreateOutcomeUnknown,
    InsufficientCredit,
    OfferGone,
    OfferRefused,
    VastClient,
    VastError,
)
from jobs import lifecycle, racers, spending
from jobs.bootstrap import render_bootstrap
from jobs.code import job_secrets
from jobs.models import Attempt, AttemptState, Job, Racer, RacerState, racer_label_for
from jobs.rent_decision import RentDecision
from jobs.renting import market, offer_claims
from jobs.renting.creates import (
    destroy_created_stopped,
    note_refused_offer,
    offer_fields,
    rental_fields,
)
from jobs.renting.settle import give_up_renting
from nomadgpu.humanize import duration, instance_price, money
from nomadgpu.tokens import issue_token

logger = logging.getLogger(__name__)

# The team's own starts: the last 30 days, weighed against the prior as 10 rentals of it.
START_WINDOW = timedelta(days=30)
PRIOR_RENTALS = 10.0
P_FAIL_MAX = 0.95
# Causes of a start that failed on the host's side (``jobs.watchdog``): what the team's start
# failures count. A cancel, a budget pause or an outbid is not the host failing to start.
START_FAILURE_CAUSES = frozenset(
    {
        "never_registered",
        "provider_gone",
        "provider_offline",
        "provider_exited",
        "provider_unknown",
        "provider_stopped",
        "start_failed",
    }
)
MAX_CREATES = 5  # creates one race may send, as a plain rent's tries (``rent.MAX_CREATE_TRIES``)


class RaceOver(Exception):
    """The racer's race is over: another racer won, or the attempt or the racer ended. Its
    agent must stop (the agent API answers 410)."""


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
    job: Job, decision: selection.Decision, *, failed: int, decided: int
) -> list[Entry]:
    """DECISION's candidates a race may take, one per machine, in rank order, each with what
    ``plan_race`` weighs (``selection.race.Contender``)."""
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
        contender = odds.Contender(
            offer_id=offer.id,
            machine_id=offer.machine_id,
            p_fail=start_failure_chance(offer.reliability, failed=failed, decided=decided),
            ready_s=ready,
            fail_s=odds.failure_known_s(ready, deadline_s=float(job.start_timeout_s)),
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


# --- The racers ------------------------------------------------------------------------------

CLAIMED, BUDGET, CLOSED = "claimed", "budget", "closed"


class _OfferHeld(Exception):
    """The offer's claim is another rent's: undo the racer's row and budget hold."""


@dataclass
class Tally:
    """What a race's creates gave: racers with an instance, racers whose create's outcome is
    unknown, and why offers did not rent."""

    created: int = 0
    unknown: int = 0
    skipped: list[str] | None = None
    stop: str = ""  # why no more creates are sent ("no_credit", "budget", "decided", ...)

    @property
    def entered(self) -> int:
        return self.created + self.unknown


def start_race(
    attempt: Attempt,
    decision: selection.Decision,
    plan: odds.RacePlan,
    entries: list[Entry],
    *,
    client: VastClient,
    now: datetime,
) -> str | None:
    """Create PLAN.k racers for ATTEMPT (module docstring), filling a slot an offer could not
    take with the next entry. Says what happened ("racing", "unknown", "no-offers"), or None
    when not one racer's budget hold was allowed: the caller then rents one host as a plain
    rent, which the plan's reservation already covers."""
    tally = Tally(skipped=[])
    # Stored before any create: a racer adopted by its label later opens the race with it.
    Attempt.objects.filter(pk=attempt.pk).update(decision=decision_record(decision, plan))
    image_login = job_secrets.image_login_for(attempt.job)  # the only secret in a create
    for entry in entries[:MAX_CREATES]:
        if tally.entered >= plan.k or tally.stop:
            break
        entered = enter_racer(attempt, entry, plan, now=now)
        if entered.racer is None:
            offer_id = entry.ranked.offer.id
            if entered.refused == CLAIMED:  # its create may be under way: this rent sends none
                tally.skipped.append(f"offer {offer_id} is being rented by another rent")
            else:
                tally.stop = entered.refused
            if entered.refused == BUDGET:
                tally.skipped.append(f"no racer on offer {offer_id}: {entered.why}")
            continue
        create_racer(
            attempt,
            entered.racer,
            entry,
            entered.token,
            tally,
            client=client,
            image_login=image_login,
            now=now,
        )
    return race_outcome(attempt, plan, tally, now=now)


@dataclass(frozen=True)
class Entered:
    """A racer committed before its create, and its agent's token; or why none was: CLAIMED
    (another rent holds the offer), BUDGET (its hold would cross a limit: WHY says which),
    CLOSED (the race was decided, or the attempt ended)."""

    racer: Racer | None = None
    token: str = ""
    refused: str = ""
    why: str = ""


def enter_racer(attempt: Attempt, entry: Entry, plan: odds.RacePlan, *, now: datetime) -> Entered:
    """Commit ENTRY's racer for ATTEMPT with its offer's claim and its budget hold (what it
    costs should it lose), in one transaction, before its create."""
    offer, ranked = entry.ranked.offer, entry.ranked
    amount = plan.loser_usd(entry.contender)
    token = issue_token()
    try:
        with transaction.atomic():
            live = Attempt.objects.select_for_update().filter(
                pk=attempt.pk,
                state__in=[AttemptState.REQUESTED, AttemptState.STARTING],
                instance_id=None,
            )
            if not live.exists():
                return Entered(refused=CLOSED)
            verdict = spending.gate().reserve_racer(attempt.job, amount_usd=amount, now=now)
            if not verdict.allowed:
                return Entered(refused=BUDGET, why=verdict.reason)
            position = (attempt.racers.aggregate(n=Max("position"))["n"] or 0) + 1
            racer = Racer.objects.create(
                attempt=attempt,
                position=position,
                label=racer_label_for(attempt, position),
                token_prefix=token.prefix,
                token_digest=token.digest,
                reserved_usd=amount,
                odds={
                    "p_fail": round(entry.contender.p_fail, 4),
                    "ready_s": round(entry.contender.ready_s, 1),
                    "loser_usd": round(amount, 6),
                },
                pull_gb=entry.pull_gb,
                disk_gb=entry.disk_gb,
                created_at=now,
                create_sent_at=now,
                **{**offer_fields(offer), **rental_fields(ranked.rental)},
            )
            if not offer_claims.claim_offer(offer.id, attempt=attempt, racer=racer, now=now):
                raise _OfferHeld
            sent = Coalesce("create_sent_at", Value(now, output_field=DateTimeField()))
            live.update(raced=F("raced") + 1, create_sent_at=sent)
    except _OfferHeld:
        return Entered(refused=CLAIMED)
    return Entered(racer=racer, token=token.token)


def create_racer(
    attempt: Attempt,
    racer: Racer,
    entry: Entry,
    token: str,
    tally: Tally,
    *,
    client: VastClient,
    image_login: str | None,
    now: datetime,
) -> None:
    """Send RACER's create (its own label and token) and record what came of it in TALLY. A
    create whose answer was lost is looked for by the racer's label before anything else is
    created: found, it races; not found, it stays requested for the watchdog to adopt."""
    job, offer, rental = attempt.job, entry.ranked.offer, entry.ranked.rental
    bid = rental.gpu_usd_per_hour if rental.rental.kind == selection.INTERRUPTIBLE else None
    try:
        created = client.create_instance(
            offer.id,
            image=job.image,
            disk_gb=entry.disk_gb,
            label=racer.label,
            onstart=render_bootstrap(attempt, token=token),
            bid_usd_per_hour=bid,
            image_login=image_login,
        )
    except OfferGone:
        void(racer, "offer_gone", now=now)
        tally.skipped.append(f"offer {offer.id} was taken")
        return
    except OfferRefused as exc:
        tally.skipped.append(note_refused_offer(attempt, offer, exc, now=now))
        void(racer, "offer_refused", now=now)
        return
    except InsufficientCredit as exc:
        void(racer, "no_credit", now=now)
        tally.stop = "no_credit"
        tally.skipped.append(
            f"Vast refused to rent for billing reasons ({exc}): a team admin must add credit "
            "to the Vast account; renting tries again on its own after the backoff"
        )
        return
    except CreateOutcomeUnknown:
        logger.warning("create for %s has an unknown outcome; looking for its label", racer)
        instance_id = settle_by_label(racer, client=client)
        if instance_id is None:
            tally.unknown += 1
            return
    except VastError as exc:
        void(racer, "create_failed", now=now)
        tally.stop = "error"
        tally.skipped.append(f"create failed: {exc}")
        return
    else:
        if created.created_stopped:
            tally.skipped.append(destroy_created_stopped(attempt, created.id, offer, client=client))
            void(racer, "created_stopped", now=now)
            return
        instance_id = created.id
    if record_instance(attempt, racer, instance_id, now=now):
        tally.created += 1
    else:
        tally.stop = CLOSED


def settle_by_label(racer: Racer, *, client: VastClient) -> int | None:
    """The instance RACER's create made, found by its label (skypilot#10171: a create that
    timed out may still have created a machine); None when Vast lists none (yet)."""
    try:
        found = client.list_instances(label=racer.label)
    except VastError as exc:
        logger.warning("listing %s by its label failed: %s", racer, exc)
        return None
    return found[0].id if found else None


def void(racer: Racer, reason: str, *, now: datetime) -> None:
    """RACER's create made no instance: it leaves the race (claim and budget hold released)."""
    racers.end_racer(racer, state=RacerState.VOID, reason=reason, now=now)


def record_instance(attempt: Attempt, racer: Racer, instance_id: int, *, now: datetime) -> bool:
    """INSTANCE_ID is RACER's: it races, and the first racer to get one opens the race (the
    attempt is starting). False when its race was decided, or its attempt ended, while it was
    being created: the instance is destroyed at once."""
    with transaction.atomic():
        Racer.objects.filter(pk=racer.pk).update(instance_id=instance_id, rented_at=now)
        racing = Racer.objects.filter(pk=racer.pk, state=RacerState.REQUESTED).update(
            state=RacerState.RACING
        )
        if not racing:
            current = Racer.objects.get(pk=racer.pk)
            if current.state != RacerState.REQUESTED and current.is_open:
                return True  # recorded already (the rent and the watchdog both found it)
            Racer.objects.filter(pk=racer.pk).update(ended_at=now)  # it billed until now
            lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, racer.pk)
            return False
        open_race(attempt, Racer.objects.get(pk=racer.pk), now=now)
    return True


def open_race(attempt: Attempt, racer: Racer, *, now: datetime) -> None:
    """The attempt's first racer with an instance opens its race: the job is starting, and a
    racer whose agent registers may win from now on (``lifecycle.mark_rented``, no instance)."""
    stored = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.REQUESTED).first()
    if stored is None:
        return  # open already (or ended: its close ended the racers)
    price = instance_price(racer.dph_base, RentDecision.of(stored).chosen_gpu_count)
    lifecycle.mark_rented(
        attempt.pk,
        fields={"disk_gb": racer.disk_gb},
        instance_id=None,
        decision=stored.decision,
        now=now,
        message=f"racing: rented instance {racer.instance_id} ({racer.gpu_name}, {price}) on "
        f"machine {racer.machine_id}, its first racer",
    )


def race_outcome(
    attempt: Attempt, plan: odds.RacePlan, tally: Tally, *, now: datetime
) -> str | None:
    """Say what a race's creates came to: racing (an event names the racers and why), creates
    whose outcome is unknown (the watchdog adopts them by label), or no racer at all (a plain
    rent instead when only the budget stood in the way; else the rent is given up)."""
    if tally.created:
        entered = list(attempt.racers.exclude(state=RacerState.VOID).order_by("position"))
        names = ", ".join(
            f"{r.instance_id or 'unknown'} (machine {r.machine_id}, "
            f"{money(r.dph_base, per_hour=True)})"
            for r in entered
        )
        skipped = f"; {'; '.join(tally.skipped)}" if tally.skipped else ""
        lifecycle.record_event(
            attempt.job_id,
            now=now,
            kind="race",
            message=f"{plan_sentence(plan)}; racers {names}{skipped}",
            racers=[r.instance_id for r in entered],
            k=plan.k,
        )
        return "racing"
    if tally.unknown:
        return "unknown"
    if tally.stop == BUDGET:
        return None
    why = "; ".join(tally.skipped or []) or "every chosen offer was taken before we could rent it"
    end_reason = "no_credit" if tally.stop == "no_credit" else "no_offers"
    return give_up_renting(attempt, now=now, why=why, end_reason=end_reason)


# --- The win ---------------------------------------------------------------------------------


def racer_terms(racer: Racer) -> dict:
    """What the winner rented, as the attempt's fields (``creates.offer_fields`` and
    ``rental_fields``, copied at its create, and its disk)."""
    names = (
        "offer_id",
        "machine_id",
        "gpu_name",
        "dph_base",
        "rental",
        "bid_margin",
        "storage_usd_per_gb_hour",
        "download_usd_per_gb",
        "upload_usd_per_gb",
        "disk_gb",
    )
    return {name: getattr(racer, name) for name in names}


def win(racer_id: int, *, now: datetime) -> Attempt:
    """RACER_ID's agent registered first: its instance, token, rates and moment of create
    become the attempt's; every other racer is lost (its token dead) and destroyed after
    commit; the timeline says "raced 2 hosts: kept 21000004 (ready in 71 s), destroyed
    21000005 while loading ($0.00190)". Raises ``RaceOver`` when its race was already over."""
    with transaction.atomic():
        racer = Racer.objects.select_for_update().filter(pk=racer_id).first()
        if racer is None or racer.state != RacerState.RACING:
            over = (racer.end_reason or racer.state) if racer else "no such racer"
        else:
            over = "" if take_attempt(racer, now=now) else "its race is over"
        if over and racer is not None and racer.is_open:
            lost = racers.end_racer(racer, state=RacerState.LOST, reason=over, now=now)
            if lost is not None:
                lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, lost)
    if over:
        raise RaceOver(over)
    return Attempt.objects.select_related("job").get(pk=racer.attempt_id)


def take_attempt(racer: Racer, *, now: datetime) -> bool:
    """The win itself, inside ``win``'s transaction: guarded on the attempt still racing."""
    attempt = Attempt.objects.get(pk=racer.attempt_id)
    taken = Attempt.objects.filter(
        pk=attempt.pk, state=AttemptState.STARTING, instance_id=None
    ).update(
        instance_id=racer.instance_id,
        token_prefix=racer.token_prefix,
        token_digest=racer.token_digest,
        rented_at=racer.rented_at,
        decision=RentDecision.of(attempt).with_chosen(racer.offer_id),
        **racer_terms(racer),
    )
    if not taken:
        return False
    Racer.objects.filter(pk=racer.pk).update(state=RacerState.WON, registered_at=now)
    # Its instance is the attempt's from now on: what it costs is the run's, which the rent's
    # reservation holds; its own hold goes.
    spending.gate().release_racer(
        attempt.job, reserved_usd=racer.reserved_usd, spent_usd=0.0, now=now
    )
    for lost in racers.end_open_racers(attempt.pk, reason="lost the race", now=now):
        lifecycle.enqueue(lifecycle.DESTROY_RACER_TASK, lost)
    won = Attempt.objects.select_related("job").get(pk=attempt.pk)
    lifecycle.note_machine_rented(won)
    others = list(won.racers.exclude(pk=racer.pk).exclude(instance_id=None).order_by("position"))
    lifecycle.record_event(
        won.job_id,
        now=now,
        kind="race_won",
        message=won_sentence(Racer.objects.get(pk=racer.pk), others, now=now),
        instance_id=racer.instance_id,
        destroyed=[r.instance_id for r in others],
    )
    return True


# What Vast last showed of a racer's instance, as the timeline says when it was destroyed.
WHILE = {
    "created": "before its host started it",
    "loading": "while loading",
    "running": "while its agent started",
}


def won_sentence(winner: Racer, others: list[Racer], *, now: datetime) -> str:
    """ "raced 2 hosts: kept 21000004 (ready in 71 s), destroyed 21000005 while loading
    ($0.00190)"; a racer that failed on its own reads "21000006 failed (provider_gone,
    $0.000400)". Each cost is billing's (``jobs.spending``: ``billing.spend.racer_spend``)."""
    ready = (now - winner.rented_at).total_seconds() if winner.rented_at else None
    parts = [f"kept {winner.instance_id} (ready in {duration(ready)})"]
    for other in others:
        cost = spending.gate().racer_cost(other, now=now)
        spent = f"{money(cost)}" if cost is not None else ""
        if other.state == RacerState.FAILED:
            why = ", ".join(x for x in (other.end_reason, spent) if x)
            parts.append(f"{other.instance_id} failed ({why})")
            continue
        where = WHILE.get(other.provider_status, "before Vast listed it")
        parts.append(f"destroyed {other.instance_id} {where}" + (f" ({spent})" if spent else ""))
    return f"raced {len(others) + 1} hosts: " + ", ".join(parts)


# --- Creates the watchdog settles, and destroys --------------------------------------------------


def adopt_racer(
    racer: Racer, instance_id: int | None, *, now: datetime, claimer_dead: bool = False
) -> str:
    """A racer whose create's outcome is unknown, as the watchdog finds it: after
    ``ADOPT_AFTER_S`` (at once when the rent's worker died: CLAIMER_DEAD) its instance, found
    by its label, races, opening its attempt's race if none did; with none after
    ``REQUESTED_GRACE_S`` (``ADOPT_AFTER_S`` for a dead worker) it is void. Says what happened."""
    waited = (now - (racer.create_sent_at or racer.created_at)).total_seconds()
    if waited < settings.ADOPT_AFTER_S and not claimer_dead:
        return "waiting"  # the rent that sent it may be recording it now
    if instance_id is not None:
        attempt = Attempt.objects.select_related("job").get(pk=racer.attempt_id)
        logger.info("adopting instance %s for %s by its label", instance_id, racer)
        return "adopted" if record_instance(attempt, racer, instance_id, now=now) else "late"
    grace = settings.ADOPT_AFTER_S if claimer_dead else settings.REQUESTED_GRACE_S
    if waited >= grace:
        void(racer, "create_never_completed", now=now)
        return "void"
    return "waiting"


def settle_requested_race(
    attempt: Attempt, by_label: dict, *, now: datetime, claimer_dead: bool = False
) -> str:
    """An attempt still requested with racers (none seen to make an instance yet): each is
    adopted by its label or voided (``adopt_racer``); with none left in the race, the rent is
    given up (its backoff). Says what happened."""
    for racer in attempt.racers.open().order_by("position"):
        found = by_label.get(racer.label)
        instance_id = found.id if found is not None else None
        adopt_racer(racer, instance_id, now=now, claimer_dead=claimer_dead)
    attempt.refresh_from_db()
    if attempt.state == AttemptState.REQUESTED and not attempt.racers.open().exists():
        return give_up_renting(attempt, now=now, why="no racer's create made an instance")
    return "settled"


def destroy_racer_instance(
    racer_id: int, *, now: datetime, client: VastClient | None = None
) -> bool:
    """Destroy the instance of a racer out of its race, and note when (the task after a win, a
    failure or an attempt's end). Never a racer still in its race. False: nothing to do."""
    racer = Racer.objects.select_related("attempt__job__team").filter(pk=racer_id).first()
    if racer is None or racer.is_open or racer.instance_id is None or racer.destroyed_at:
        return False
    if racer.state == RacerState.WON:
        return False  # its instance is the attempt's, destroyed with it
    with market.team_client(racer.attempt.job.team, client=client) as vast:
        vast.destroy_instance(racer.instance_id)
    Racer.objects.filter(pk=racer_id, destroyed_at=None).update(destroyed_at=now)
    return True
