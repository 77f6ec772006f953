from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F
from django.utils import timezone

from hosts.wait_or_move import ReturnHistory

# What a machine's record takes from the offer it was rented through (its summary in the
# attempt's stored decision, ``hosts.selection.offer_summary``).
OFFER_FACTS = ("geolocation", "host_id", "num_gpus")


class MachineManager(models.Manager):
    def note_rented(
        self, machine_id: int, *, gpu_name: str, at: datetime | None, offer: dict
    ) -> None:
        """Count a rental of MACHINE_ID at AT; fill in where it is and what it holds from the
        OFFER it was rented through (``RentDecision.offer_summary``), as far as the offer says."""
        machine, _ = self.get_or_create(machine_id=machine_id, defaults={"gpu_name": gpu_name})
        facts = {k: offer[k] for k in OFFER_FACTS if offer.get(k) not in (None, "")}
        self.filter(pk=machine.pk).update(
            rentals=F("rentals") + 1, last_seen_at=at or timezone.now(), **facts
        )


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

    @property
    def return_history(self) -> ReturnHistory:
        """Its offline spells, as ``hosts.wait_or_move`` weighs them."""
        return ReturnHistory(
            returns=self.offline_returns, return_s=self.offline_return_s, never=self.offline_never
        )
