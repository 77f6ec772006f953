"""Notification channels of a team and the outbox of deliveries to them.

Every notifiable ``JobEvent`` becomes one ``Delivery`` row per subscribed channel, written in the
event's own transaction (``notify.outbox.enqueue_for_event``), so a rolled-back event notifies no
one and a committed one is never forgotten. Workers claim due rows with guarded updates.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from jobs.models import JobEvent
from nomadgpu.fields import EncryptedTextField
from nomadgpu.models import Team


class EventKind(models.TextChoices):
    """The JobEvent kinds a channel can subscribe to; other kinds never notify."""

    HOST_LOST = "host_lost", "Host lost"
    # Sent with the first training step after a loss (kind kept for subscriptions/webhooks).
    RUNNING_AGAIN = "running_again", "Training again"
    FINISHED = "finished", "Job finished"
    FAILED = "failed", "Job failed"
    NO_OFFERS = "no_offers", "No offer matches"
    # No percentage in a kind's name: each message quotes the share its event fired at.
    BUDGET_WARNING = "budget_warning", "Budget warning"
    BUDGET_PAUSED = "budget_paused", "Budget pause"
    # A member asks the team's admins to resume a budget-paused job (once per pause).
    RESUME_ASKED = "resume_asked", "Asked to resume"
    INVOICE_DISCREPANCY = "invoice_discrepancy", "Invoice discrepancy"
    # Its stored spec no longer validates: renting stopped until a person fixes it.
    NEEDS_ATTENTION = "needs_attention", "Job needs attention"


NOTIFIABLE_KINDS = frozenset(EventKind.values)


def all_event_kinds() -> list[str]:
    return list(EventKind.values)


class ChannelKind(models.TextChoices):
    TELEGRAM = "telegram", "Telegram"
    WEBHOOK = "webhook", "Webhook"


class Channel(models.Model):
    """Where a team's notifications go: a Telegram chat or a signed JSON webhook."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="channels")
    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    name = models.CharField(max_length=100)
    enabled = models.BooleanField(default=True)
    event_kinds = models.JSONField(default=all_event_kinds, blank=True)

    telegram_bot_token = EncryptedTextField(blank=True, help_text="Empty: the team's bot token.")
    chat_id = models.CharField(
        max_length=64, blank=True, help_text="A numeric chat id (groups are negative) or @name."
    )
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret = EncryptedTextField(blank=True)

    # Set when a permanent error (bot blocked, chat gone, webhook 4xx) switched the channel off.
    disabled_reason = models.CharField(max_length=300, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    SECRET_FIELDS = ("telegram_bot_token", "webhook_secret")

    class Meta:
        ordering = ["team__name", "name"]
        indexes = [models.Index(fields=["team", "enabled"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def wants(self, kind: str) -> bool:
        return self.enabled and kind in (self.event_kinds or [])

    @property
    def bot_token(self) -> str:
        """The channel's own bot token, else the team's."""
        return self.telegram_bot_token or self.team.telegram_bot_token


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"  # claimed by a worker until next_attempt_at (its lease)
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


OPEN_STATES = [DeliveryState.PENDING, DeliveryState.SENDING]


class Delivery(models.Model):
    """One event to one channel: claimed, sent and recorded at most once per attempt."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(JobEvent, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    # Pending: when to try (next). Sending: when the worker's lease runs out and another
    # worker may take the row over. Null once sent or failed, so it leaves the partial index.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(fields=["channel", "event"], name="one_delivery_per_channel")
        ]
        indexes = [
            # The delivery loop's one query: open rows whose time has come.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(state__in=OPEN_STATES),
                name="delivery_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event.kind} → {self.channel} ({self.state})"
