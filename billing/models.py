from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from nomadgpu.models import Team

# Budgets arrive with the spending-limits issue.


# --- Invoices: charges and payments imported from Vast, reconciliation flags -----------------


class ChargeOrigin(models.TextChoices):
    API = "api", "Vast API"
    CSV = "csv", "CSV upload"


class Charge(models.Model):
    """What Vast billed one contract (``source``) on one UTC day: the invoice, as imported.

    The natural key is (team, source, day): the sync asks for one day window at a time, so a
    re-import (or a CSV of the same days) replaces the row instead of adding a second one.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="charges")
    source = models.CharField(max_length=80)  # "instance-<id>", "volume-<id>", ...
    day = models.DateField()
    instance_id = models.BigIntegerField(null=True, blank=True)
    type = models.CharField(max_length=20, blank=True)
    label = models.CharField(max_length=300, blank=True)
    description = models.CharField(max_length=300, blank=True)
    start = models.DateTimeField(null=True, blank=True)
    end = models.DateTimeField(null=True, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=4)
    # Set by matching (instance id and time); null: an orphan or a rental made outside NomadGPU.
    attempt = models.ForeignKey(
        "jobs.Attempt", on_delete=models.SET_NULL, null=True, blank=True, related_name="charges"
    )
    origin = models.CharField(max_length=8, choices=ChargeOrigin.choices)
    imported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["day", "source"]
        constraints = [
            models.UniqueConstraint(fields=["team", "source", "day"], name="one_charge_per_day")
        ]
        indexes = [models.Index(fields=["team", "instance_id"])]

    def __str__(self) -> str:
        return f"{self.source} {self.day} ${self.amount}"


class ChargeItem(models.Model):
    """One category of a charge: ``gpu``, ``disk``, ``bwd`` (download) or ``bwu`` (upload).

    Quantity and rate come from the description text (Vast puts them nowhere else); they are
    null when the wording is not recognised. ``rate`` is USD per ``rate_unit``.
    """

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveSmallIntegerField()
    type = models.CharField(max_length=10)
    description = models.CharField(max_length=300, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=4)
    quantity = models.DecimalField(max_digits=16, decimal_places=6, null=True, blank=True)
    unit = models.CharField(max_length=20, blank=True)
    rate = models.DecimalField(max_digits=16, decimal_places=8, null=True, blank=True)
    rate_unit = models.CharField(max_length=20, blank=True)

    class Meta:
        ordering = ["charge", "position"]
        constraints = [
            models.UniqueConstraint(fields=["charge", "position"], name="one_item_per_position")
        ]

    def __str__(self) -> str:
        return f"{self.type} ${self.amount}"


class Payment(models.Model):
    """A payment or credit from ``GET /api/v1/invoices/``; positive = money into the account."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="payments")
    invoice_id = models.CharField(max_length=64)
    type = models.CharField(max_length=20, blank=True)
    service = models.CharField(max_length=40, blank=True)
    source = models.CharField(max_length=200, blank=True)
    description = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=4)
    imported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "invoice_id"], name="one_payment_per_invoice")
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.invoice_id} ${self.amount}"


class InvoiceSync(models.Model):
    """Where a team's import stands: days before ``charges_complete_through`` + 1 are final.

    The cursor moves one day at a time, in the same transaction as that day's charges, so an
    import that fails halfway resumes at the first day it did not finish.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="invoice_sync")
    charges_complete_through = models.DateField(null=True, blank=True)
    # The upper bound of the last import that finished: usage before it is on the invoice.
    synced_until = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"invoice sync of {self.team}"


class FlagStatus(models.TextChoices):
    OPEN = "open", "Open"
    REVIEWED = "reviewed", "Reviewed"


class DiscrepancyFlag(models.Model):
    """A reconciliation difference outside the tolerance, kept so finance can review it once.

    One per attempt (over-/under-billed, unbilled usage) or per unmatched charge. The event
    for notifications is written when the flag is created, never again.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="discrepancy_flags")
    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.CASCADE, null=True, blank=True, related_name="flag"
    )
    charge = models.OneToOneField(
        Charge, on_delete=models.CASCADE, null=True, blank=True, related_name="flag"
    )
    kind = models.CharField(max_length=20)  # the reconciliation status that raised it
    recorded_usd = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    billed_usd = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    reason = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=10, choices=FlagStatus.choices, default=FlagStatus.OPEN)
    note = models.TextField(blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(attempt__isnull=False) & models.Q(charge__isnull=True))
                | (models.Q(attempt__isnull=True) & models.Q(charge__isnull=False)),
                name="flag_has_one_subject",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"
