from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from nomadgpu.models import Team


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RENTING = "renting", "Renting"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    RECOVERING = "recovering", "Recovering"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PAUSED_BUDGET = "paused_budget", "Paused (budget)"


class Job(models.Model):
    """A fine-tuning job: what to run and on what. Its attempts are rentals of hosts."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="jobs"
    )
    name = models.CharField(max_length=120)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    image = models.CharField(max_length=300)
    command = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "state"])]

    def __str__(self) -> str:
        return self.name


class JobEvent(models.Model):
    """Append-only history of a job: every transition and notable observation."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created_at:%Y-%m-%d %H:%M:%S}"
