from __future__ import annotations

from decimal import Decimal
from zoneinfo import available_timezones

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from nomadgpu.fields import EncryptedTextField


def validate_time_zone(value: str) -> None:
    if value not in available_timezones():
        raise ValidationError(f"{value!r} is not an IANA time zone (for example Europe/Berlin).")


class Team(models.Model):
    """A team owns jobs, a Vast account, storage, budgets and notification channels."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(unique=True)
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    # The savings report compares billed cost with renting this elsewhere (default: one A100
    # on demand) and may credit the reference with being faster (speed factor > 1).
    reference_name = models.CharField(max_length=100, default="1x A100 80GB on demand")
    reference_rate_usd_per_hour = models.DecimalField(
        max_digits=8, decimal_places=4, default=Decimal("4.1000")
    )
    reference_speed_factor = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("1.00")
    )
    public_status_page = models.BooleanField(default=False)

    vast_url = models.URLField(blank=True, help_text="Empty: the server's VAST_URL.")
    vast_api_key = EncryptedTextField(blank=True)
    telegram_bot_token = EncryptedTextField(blank=True)
    storage_endpoint_url = models.URLField(blank=True, help_text="Empty: the server's storage.")
    storage_bucket = models.CharField(max_length=63, blank=True)
    storage_access_key_id = EncryptedTextField(blank=True)
    storage_secret_access_key = EncryptedTextField(blank=True)

    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    SECRET_FIELDS = (
        "vast_api_key",
        "telegram_bot_token",
        "storage_access_key_id",
        "storage_secret_access_key",
    )


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    FINANCE = "finance", "Finance"
    ADMIN = "admin", "Admin"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")
        ]
        ordering = ["team__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ServiceHeartbeat(models.Model):
    """Last sign of life of a supervisor process or loop (watchdog tick, worker, beat)."""

    name = models.CharField(max_length=64, primary_key=True)
    last_seen_at = models.DateTimeField()
    count = models.PositiveBigIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A member's personal API token for the member API and the CLI.

    Shown once at creation; stored as a lookup prefix and a SHA-256 digest
    (``nomadgpu.api_tokens``). A revoked token stays listed but never authenticates again.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.user}, ngpt_{self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
