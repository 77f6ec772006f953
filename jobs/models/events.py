"""A job's history: its events (append-only), its interruptions (every status-page number
comes from these) and its loss curve's samples."""

from __future__ import annotations

import logging

from django.db import models, transaction
from django.utils import timezone

from jobs.models.attempt import Attempt
from jobs.models.job import Job

# One console line per job event: what an operator watching `make run` wants to see.
event_log = logging.getLogger("nomadgpu.events")
WARNING_EVENTS = frozenset({"host_lost", "failed", "no_offers", "budget_paused"})


class JobEventManager(models.Manager):
    def record(self, job_id: int, *, now, kind: str, message: str = "", data=None) -> JobEvent:
        """Append an event to JOB_ID's history (any app may: billing flags an invoice here).
        Notifications follow from the row itself (``notify`` listens for new events), and the
        console line is written once the transaction commits."""
        event = self.create(
            job_id=job_id, created_at=now, kind=kind, message=message, data=data or {}
        )
        transaction.on_commit(lambda: _log_event(event))
        return event


def _log_event(event: JobEvent) -> None:
    level = logging.WARNING if event.kind in WARNING_EVENTS else logging.INFO
    text = f"job {event.job_id}: {event.kind.replace('_', ' ')}"
    event_log.log(level, f"{text}: {event.message}" if event.message else text)


class JobEvent(models.Model):
    """Append-only history of a job: every transition and notable observation."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    objects = JobEventManager()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class Interruption(models.Model):
    """A host lost under a job: when it was last heard, detected, replaced, back on a machine
    and training again (the two figures: ``jobs.recovery_times``).

    Every status-page number comes from these rows, except a fire drill's (``drill``): a loss
    caused on purpose stays on the job's timeline and out of every public figure and rate.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="interruptions")
    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="interruption")
    cause = models.CharField(max_length=40)
    detail = models.CharField(max_length=300, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    detected_at = models.DateTimeField()
    replacement_rented_at = models.DateTimeField(null=True, blank=True)
    # The replacement running (its agent reported the training command started): "back on a
    # machine". Then its first training step: "training again" (``jobs.recovery_times``).
    running_again_at = models.DateTimeField(null=True, blank=True)
    training_again_at = models.DateTimeField(null=True, blank=True)
    step_reached = models.PositiveIntegerField(null=True, blank=True)
    resumed_step = models.PositiveIntegerField(null=True, blank=True)
    cancelled_before_recovery = models.BooleanField(default=False)
    # Caused by a fire drill (``jobs.drill``): the attempt was marked before its host was
    # destroyed. Kept on the job's timeline; left out of the status page and every rate.
    drill = models.BooleanField(default=False)
    # The attempt that ran again (set when the interruption closes): its phase boundaries
    # are the recovery's anatomy (``jobs.anatomy.breakdown``).
    replacement = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-detected_at"]
        indexes = [models.Index(fields=["detected_at"])]

    def __str__(self) -> str:
        return f"{self.job} lost host ({self.cause}) at {self.detected_at:%Y-%m-%d %H:%M:%S}"


class LossPoint(models.Model):
    """A sample of the training loss for the job page's chart.

    Written by the heartbeat only when the step crosses into a new bucket of
    ``loss_sample_every(total_steps)`` steps (about 100 points per job), never on every beat.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="loss_points")
    step = models.PositiveIntegerField()
    loss = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="one_loss_point_per_step")
        ]

    def __str__(self) -> str:
        return f"{self.job} step {self.step}: {self.loss:.4f}"


LOSS_POINTS_PER_JOB = 100


def loss_sample_every(total_steps: int | None) -> int:
    """Steps between two loss samples: about ``LOSS_POINTS_PER_JOB`` per job (every 10 steps
    when the total is unknown)."""
    if not total_steps:
        return 10
    return max(1, total_steps // LOSS_POINTS_PER_JOB)
