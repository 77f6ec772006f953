from __future__ import annotations

from decimal import Decimal
from zoneinfo import available_timezones

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
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


class TeamSecret(models.Model):
    """A value a team's jobs may name (``HF_TOKEN``, ``WANDB_API_KEY``, a registry login, a git
    deploy key): sealed at rest like the Vast key and never shown again; the agent of a job
    that names it gets it over its authenticated register call and puts it in the command's
    environment (never in the provider's create request)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(
        max_length=64,
        validators=[
            RegexValidator(
                r"^[A-Za-z_][A-Za-z0-9_]*$",
                "A secret's name is an environment variable name: letters, digits and _.",
            )
        ],
    )
    value = EncryptedTextField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_secret_per_name")]
        ordering = ["team__name", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.team})"


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


class IngestOutage(models.Model):
    """A time the agent API could not take heartbeats: the web process down, its database
    unreachable, or every agent silent at once (a broken proxy, DNS or certificate between the
    hosts and the portal). Heartbeat silence inside one is the supervisor's, not the hosts':
    the watchdog counts each attempt's silence from ``ended_at`` (``nomadgpu.ingest``)."""

    WEB_DOWN = "web_down"
    AGENTS_SILENT = "agents_silent"
    CAUSES = ((WEB_DOWN, "agent API down"), (AGENTS_SILENT, "no agent reached the agent API"))

    cause = models.CharField(max_length=16, choices=CAUSES)
    started_at = models.DateTimeField(help_text="The last moment ingest was known to work.")
    ended_at = models.DateTimeField(null=True, blank=True, help_text="Empty while it lasts.")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["ended_at"])]
        # Its start is the last moment ingest was known to work: the web's beacon coming back
        # and the watchdog seeing it gone can both record the same outage at once (a database
        # restart reconnects them together), and they must land on one row.
        constraints = [models.UniqueConstraint(fields=["started_at"], name="one_outage_per_start")]

    def __str__(self) -> str:
        return f"{self.get_cause_display()} from {self.started_at:%Y-%m-%d %H:%M:%S}"


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
