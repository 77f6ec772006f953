from __future__ import annotations

from django.db import models
from django.utils import timezone


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
    # Seconds per training step relative to the GPU model's norm (1.0 = typical, 1.5 = slow).
    observed_speed_factor = models.FloatField(null=True, blank=True)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "machine_id"], name="one_row_per_machine")
        ]
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return f"{self.provider} machine {self.machine_id} ({self.gpu_name})"
