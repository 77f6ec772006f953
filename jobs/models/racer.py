"""Hedged rents: the instances one attempt races (``Racer``), and the per-offer claim that keeps
an offer from being bought twice (``OfferClaim``). ``jobs.renting.race`` creates them,
``jobs.racers`` ends them, the watchdog follows them (``jobs.watchdog.races``)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models.attempt import Attempt


def racer_label_for(attempt: Attempt, position: int) -> str:
    """The instance label of ATTEMPT's racer POSITION: ``ngpu:<env>:<job>:<attempt>.<k>``,
    which ``parse_label`` reads as the attempt's (the reaper knows it for ours)."""
    return f"ngpu:{settings.NOMADGPU_ENV}:{attempt.job_id}:{attempt.number}.{position}"


class RacerState(models.TextChoices):
    REQUESTED = "requested", "Requested"  # row committed, create sent; outcome may be unknown
    RACING = "racing", "Racing"  # its instance exists; its agent has not registered
    WON = "won", "Won"  # its agent registered first: its instance and token are the attempt's
    LOST = "lost", "Lost"  # another racer won, or the attempt ended: destroyed at once
    FAILED = "failed", "Failed"  # its host failed on its own before its agent registered
    VOID = "void", "Void"  # its create made no instance (refused, gone, never seen)


OPEN_RACER_STATES = [RacerState.REQUESTED, RacerState.RACING]
ENDED_RACER_STATES = [RacerState.LOST, RacerState.FAILED, RacerState.VOID]


class RacerQuerySet(models.QuerySet):
    def open(self) -> RacerQuerySet:
        """Racers still in their race (requested or racing)."""
        return self.filter(state__in=OPEN_RACER_STATES)

    def not_kept(self) -> RacerQuerySet:
        """Racers whose instance is not the attempt's: every one but the winner. What they cost
        is money the job spent (``billing.spend``)."""
        return self.exclude(state=RacerState.WON)


class Racer(models.Model):
    """One instance of a hedged rent: an attempt creates k of them on different machines, keeps
    the first whose agent registers (its instance and token become the attempt's) and destroys
    the rest. Its own label and agent token; what it was rented at, copied from its offer, for
    what it costs (``billing.spend.racer_spend``)."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="racers")
    position = models.PositiveSmallIntegerField()  # 1..k, in rank order
    label = models.CharField(max_length=120)
    state = models.CharField(
        max_length=10, choices=RacerState.choices, default=RacerState.REQUESTED
    )
    end_reason = models.CharField(max_length=40, blank=True)

    # What it rents (units as on ``Attempt``), and its image pull as priced (GB).
    offer_id = models.BigIntegerField()
    machine_id = models.BigIntegerField(null=True, blank=True)
    gpu_name = models.CharField(max_length=60, blank=True)
    dph_base = models.FloatField(default=0)
    rental = models.CharField(max_length=16, default="on-demand")
    bid_margin = models.FloatField(null=True, blank=True)
    storage_usd_per_gb_hour = models.FloatField(default=0)
    download_usd_per_gb = models.FloatField(default=0)
    upload_usd_per_gb = models.FloatField(default=0)
    disk_gb = models.FloatField(default=0)
    pull_gb = models.FloatField(default=0)
    instance_id = models.BigIntegerField(null=True, blank=True, unique=True)

    # Its agent's token (prefix + SHA-256 digest, as an attempt's): dead once it is not open.
    token_prefix = models.CharField(max_length=16, unique=True, null=True, blank=True)
    token_digest = models.CharField(max_length=64, blank=True)
    # The budget it holds while it races (``jobs.spending``), and why it was raced.
    reserved_usd = models.FloatField(default=0)
    odds = models.JSONField(default=dict, blank=True)  # p_fail, ready_s, loser_usd

    provider_status = models.CharField(max_length=20, blank=True)
    provider_status_msg = models.CharField(max_length=500, blank=True)
    provider_unknown_polls = models.PositiveSmallIntegerField(default=0)
    # Its own start deadline (``jobs.watchdog.start_due.racer_due``): from its machine's link
    # and whether that machine holds the image, pushed by what Vast shows of its instance, as
    # a plain rent's host is judged; past it, the racer fails on its own and the others race on.
    start_due_at = models.DateTimeField(null=True, blank=True)
    start_due_why = models.CharField(max_length=300, blank=True)
    start_pull_seen = models.BooleanField(default=False)  # pulling on a machine taken to hold it

    created_at = models.DateTimeField(default=timezone.now)
    create_sent_at = models.DateTimeField(null=True, blank=True)
    rented_at = models.DateTimeField(null=True, blank=True)  # the create accepted: storage bills
    loading_at = models.DateTimeField(null=True, blank=True)  # first seen pulling its image
    running_at = models.DateTimeField(null=True, blank=True)  # first seen running: GPU bills
    registered_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)  # out of the race: destroy sent
    destroyed_at = models.DateTimeField(null=True, blank=True)  # no longer listed by Vast

    objects = RacerQuerySet.as_manager()

    class Meta:
        ordering = ["attempt", "position"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "position"], name="racer_position"),
            # Exactly one winner: the attempt holds one instance and one token.
            models.UniqueConstraint(
                fields=["attempt"], condition=models.Q(state="won"), name="one_winner_per_race"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt} racer {self.position}"

    @property
    def job_id(self) -> int:
        return self.attempt.job_id

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_RACER_STATES


class OfferClaimQuerySet(models.QuerySet):
    def held(self) -> OfferClaimQuerySet:
        return self.filter(released_at=None)

    def release(self, *, now: datetime, **holder) -> int:
        """Release the claims HOLDER (``attempt_id=`` or ``racer_id=``) holds; how many."""
        return self.held().filter(**holder).update(released_at=now)

    def release_stale(self, offer_id: int, *, now: datetime) -> int:
        """Release OFFER_ID's claim if its holder has ended (its racer out of the race, or its
        attempt ended): a claim outlives nothing it guards."""
        stale = (
            self.held()
            .filter(offer_id=offer_id)
            .filter(
                models.Q(racer__state__in=ENDED_RACER_STATES) | models.Q(attempt__state="ended")
            )
        )
        return stale.update(released_at=now)


class OfferClaim(models.Model):
    """One offer claimed by one rent before its create is sent: the partial unique index on the
    offer id while it is held means two rents (two jobs, or two racers of one) never create on
    the same offer. Vast accepted two parallel buyers of one offer (skypilot#9117), so its own
    answer is not the guard. Released when its holder ends (its racer out of the race, or its
    attempt ended); a stale one is released by the next claim of its offer."""

    offer_id = models.BigIntegerField()
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="offer_claims")
    racer = models.ForeignKey(
        Racer, on_delete=models.CASCADE, null=True, blank=True, related_name="offer_claims"
    )
    claimed_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = OfferClaimQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["offer_id"],
                condition=models.Q(released_at=None),
                name="one_claim_per_offer",
            )
        ]

    def __str__(self) -> str:
        return f"offer {self.offer_id} claimed by {self.attempt}"
