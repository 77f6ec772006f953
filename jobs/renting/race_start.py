"""A hedged rent's racers created (``jobs.renting.race`` decides how many): each committed with
its offer's claim and its budget hold before its create; a create that timed out settled by its
label before the next; the first racer with an instance opens the race.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

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
from jobs.models import Attempt, AttemptState, Racer, RacerState, racer_label_for
from jobs.rent_decision import RentDecision
from jobs.renting import offer_claims
from jobs.renting.creates import (
    destroy_created_stopped,
    note_refused_offer,
    offer_fields,
    rental_fields,
)
from jobs.renting.race import Entry, decision_record, plan_sentence
from jobs.renting.settle import give_up_renting
from nomadgpu.humanize import instance_price, money
from nomadgpu.tokens import issue_token

logger = logging.getLogger(__name__)

MAX_CREATES = 5  # creates one race may send, as a plain rent's tries (``rent.MAX_CREATE_TRIES``)

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
