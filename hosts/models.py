from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import models
from django.db.models import F
from django.utils import timezone

from hosts.selection import machine_memory as mm
from hosts.wait_or_move import ReturnHistory

# What a machine's record takes from the offer it was rented through (its summary in the
# attempt's stored decision, ``hosts.selection.offer_summary``).
OFFER_FACTS = ("geolocation", "host_id", "num_gpus", "reliability")


class MachineManager(models.Manager):
    def note_rented(
        self,
        machine_id: int,
        *,
        gpu_name: str,
        at: datetime | None,
        offer: dict,
        attempt_id: int | None = None,
        racer_id: int | None = None,
    ) -> MachineRental | None:
        """Count a rental of MACHINE_ID at AT; fill in where it is and what it holds from the
        OFFER it was rented through (``RentDecision.offer_summary``), as far as the offer says;
        open the rental's record for the team's memory (ATTEMPT_ID, or a failed racer's
        RACER_ID: the rental's own id) and return it."""
        machine, _ = self.get_or_create(machine_id=machine_id, defaults={"gpu_name": gpu_name})
        facts = {k: offer[k] for k in OFFER_FACTS if offer.get(k) not in (None, "")}
        at = at or timezone.now()
        self.filter(pk=machine.pk).update(rentals=F("rentals") + 1, last_seen_at=at, **facts)
        if attempt_id is None and racer_id is None:
            return None
        key = {"attempt_id": attempt_id} if attempt_id is not None else {"racer_id": racer_id}
        record, _ = MachineRental.objects.get_or_create(
            **key, defaults={"machine": machine, "rented_at": at}
        )
        return record


class Machine(models.Model):
    """A provider machine we have seen: its reputation and how fast it really trains.

    Knows nothing of jobs: selection reads it as plain data (observed speed, interruptions).
    """

    provider = models.CharField(max_length=20, default="vast")
    machine_id = models.BigIntegerField()
    host_id = models.BigIntegerField(null=True, blank=True)
    gpu_name = models.CharField(max_length=60, blank=True)
    num_gpus = models.PositiveSmallIntegerField(default=1)
    geolocation = models.CharField(max_length=100, blank=True)
    reliability = models.FloatField(null=True, blank=True)  # Vast's score on its last offer
    rentals = models.PositiveIntegerField(default=0)
    interruptions = models.PositiveIntegerField(default=0)
    # Offline spells a job waited on (``hosts.wait_or_move.ReturnHistory``): those it came back
    # from, their seconds offline in all, and those it did not come back from in time.
    offline_returns = models.PositiveIntegerField(default=0)
    offline_return_s = models.FloatField(default=0)
    offline_never = models.PositiveIntegerField(default=0)
    # Seconds per training step relative to the GPU model's norm (1.0 = typical, 1.5 = slow).
    observed_speed_factor = models.FloatField(null=True, blank=True)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)

    objects = MachineManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "machine_id"], name="one_row_per_machine")
        ]
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return f"{self.provider} machine {self.machine_id} ({self.gpu_name})"

    def memory_at(self, now: datetime) -> mm.MachineRecord:
        """The team's memory of this machine at NOW (``hosts.selection.machine_memory``), from
        its rental records (prefetch ``rental_records`` to read many machines at once)."""
        horizon = now - timedelta(days=mm.HORIZON_DAYS)
        ended = [
            r.as_record()
            for r in self.rental_records.all()
            if r.ended_at is not None and horizon <= r.ended_at <= now
        ]
        return mm.remember(self.machine_id, ended, now)

    @property
    def return_history(self) -> ReturnHistory:
        """Its offline spells, as ``hosts.wait_or_move`` weighs them."""
        return ReturnHistory(
            returns=self.offline_returns, return_s=self.offline_return_s, never=self.offline_never
        )


class Incident(models.TextChoices):
    """What went wrong on a rental (``hosts.selection.machine_memory``'s kinds)."""

    NEVER_READY = mm.NEVER_READY, "never ready"
    LOST_LOADING = mm.LOST_LOADING, "lost while loading"
    LOST_RUNNING = mm.LOST_RUNNING, "lost while running"
    STALLED = mm.STALLED, "stalled"


class MachineRentalManager(models.Manager):
    def memory(
        self, *, now: datetime, machine_ids: Iterable[int] | None = None
    ) -> mm.MachineMemory:
        """The team's memory of machines at NOW (of MACHINE_IDS only, when given): each
        machine's ended rentals of the last ``HORIZON_DAYS``, summed with decay."""
        rows = self.filter(
            ended_at__gte=now - timedelta(days=mm.HORIZON_DAYS), ended_at__lte=now
        ).select_related("machine")
        if machine_ids is not None:
            rows = rows.filter(machine__machine_id__in=list(machine_ids))
        by_machine: dict[int, list[mm.RentalRecord]] = defaultdict(list)
        for row in rows:
            by_machine[row.machine.machine_id].append(row.as_record())
        return mm.MachineMemory({m: mm.remember(m, found, now) for m, found in by_machine.items()})


class MachineRental(models.Model):
    """One rental of a machine, as the team's memory of machines weighs it: whether it got
    ready, how long it ran, what went wrong and whether that was charged to the machine, and
    what it showed of its speed and link (docs/renting-and-recovery.md, "A team memory of
    machines"). Opened at the rent, completed when the rental ends; the decay is computed when
    it is read (``hosts.selection.machine_memory``). ``attempt_id`` is the rental's id in
    ``jobs`` (hosts knows nothing of jobs: a plain number, for the admin to name it); a hedged
    rent's racer that failed on its own is a rental too, one that never got ready, and is kept
    under ``racer_id`` instead (its race's losers are not: they never had their chance)."""

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="rental_records")
    attempt_id = models.BigIntegerField(unique=True, null=True, blank=True)
    racer_id = models.BigIntegerField(unique=True, null=True, blank=True)
    rented_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True, blank=True)  # its agent registered
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    incident = models.CharField(max_length=20, choices=Incident.choices, blank=True)
    cause = models.CharField(max_length=40, blank=True)  # the loss cause the watchdog named
    # Why the incident is not charged to the machine ("" when it is): ours, not the machine's.
    excused = models.CharField(max_length=200, blank=True)
    outbids = models.PositiveSmallIntegerField(default=0)
    seconds_per_step = models.FloatField(null=True, blank=True)
    promised_seconds_per_step = models.FloatField(null=True, blank=True)  # from DLPerf
    down_mbps = models.FloatField(null=True, blank=True)  # measured by its agent
    advertised_down_mbps = models.FloatField(null=True, blank=True)  # the offer's inet_down

    objects = MachineRentalManager()

    class Meta:
        ordering = ["-rented_at"]
        indexes = [models.Index(fields=["machine", "ended_at"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(attempt_id__isnull=False) ^ models.Q(racer_id__isnull=False),
                name="machine_rental_of_an_attempt_or_a_racer",
            )
        ]

    def __str__(self) -> str:
        whose = f"rental {self.attempt_id}" if self.racer_id is None else f"racer {self.racer_id}"
        return f"{whose} of machine {self.machine.machine_id}"

    @property
    def running_h(self) -> float:
        """Hours from ready to the end (0 when it never got ready or has not ended)."""
        if self.ready_at is None or self.ended_at is None:
            return 0.0
        return max((self.ended_at - self.ready_at).total_seconds(), 0.0) / 3600

    def as_record(self) -> mm.RentalRecord:
        """This rental as the memory weighs it."""
        return mm.RentalRecord(
            rented_at=self.rented_at,
            ended_at=self.ended_at or self.rented_at,
            ready=self.ready_at is not None,
            running_h=self.running_h,
            incident=self.incident,
            excused=self.excused,
            outbids=self.outbids,
            speed_ratio=_ratio(self.seconds_per_step, self.promised_seconds_per_step),
            # Vast's inet_down is the host's own speed test: a restore measured above it (the
            # agent overlaps it with other work) is taken as the advertised link, no better.
            link_ratio=min(_ratio(self.down_mbps, self.advertised_down_mbps) or 0.0, 1.0) or None,
        )


def _ratio(measured: float | None, promised: float | None) -> float | None:
    return measured / promised if measured and promised and measured > 0 and promised > 0 else None
