"""A checkpoint: a packed object under its attempt's prefix, ready only once verified and its
manifest written (last)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from jobs.models.attempt import Attempt
from jobs.models.job import Job


class CheckpointState(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    PRUNED = "pruned", "Pruned"


class CheckpointQuerySet(models.QuerySet):
    def ready(self) -> CheckpointQuerySet:
        """Checkpoints a resume may start from: verified, manifest written, not pruned."""
        return self.filter(state=CheckpointState.READY)

    def newest_first(self) -> CheckpointQuerySet:
        """Highest step first; of two at one step (two attempts), the later upload."""
        return self.order_by("-step", "-ready_at")

    def newest_ready(self) -> Checkpoint | None:
        """The ready checkpoint a resume starts from, or None."""
        return self.ready().newest_first().first()

    def newest_ready_step(self) -> int | None:
        """The step of ``newest_ready``, in one query, or None."""
        return self.ready().newest_first().values_list("step", flat=True).first()

    def upload_seconds(self, newest: int) -> list[float]:
        """How long the NEWEST uploads took, the agent asking for targets to ready (what a
        checkpoint costs: budget enforcement's lead, the adaptive interval's δ)."""
        rows = (
            self.filter(ready_at__isnull=False)
            .order_by("-ready_at")
            .values_list("created_at", "ready_at")[:newest]
        )
        return [(ready - created).total_seconds() for created, ready in rows if ready >= created]


class Checkpoint(models.Model):
    """A packed checkpoint object; ready only once verified and its manifest written (last)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    state = models.CharField(
        max_length=10, choices=CheckpointState.choices, default=CheckpointState.UPLOADING
    )
    key = models.CharField(max_length=400, db_index=True)  # the local store's write guard
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    encrypted = models.BooleanField(default=False)
    upload_id = models.CharField(max_length=200, blank=True)
    part_size = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["job", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "step"], name="one_checkpoint_per_step")
        ]
        indexes = [models.Index(fields=["job", "state", "-step"])]

    def __str__(self) -> str:
        return f"{self.job} step {self.step} ({self.state})"
