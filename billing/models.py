"""Spending limits (per team per day / week / month, per member per month; the per-job limit
is ``Job.budget_usd``), the warnings sent, the pauses made and the budget reserved for rents;
then the invoice ledger: charges and payments imported from Vast and reconciliation flags."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models import Attempt, Job, JobEvent
from nomadgpu.models import Team


class LimitKind(models.TextChoices):
    JOB = "job", "job"
    DAY = "day", "daily"
    WEEK = "week", "weekly"
    MONTH = "month", "monthly"
    MEMBER_MONTH = "member_month", "per-member monthly"


def _limit_field(help_text: str) -> models.DecimalField:
    return models.DecimalField(
        max_digits=10, decimal_places=3, null=True, blank=True, help_text=help_text
    )


class TeamBudget(models.Model):
    """A team's spending limits in USD; empty means no limit. Calendar periods in the team's
    time zone (weeks start on Monday). The row is also the team's budget lock: checks that
    reserve budget take it with ``select_for_update`` so two rents never share the headroom."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="budget")
    daily_usd = _limit_field("Per calendar day (team time zone).")
    weekly_usd = _limit_field("Per calendar week, Monday 00:00 to Monday 00:00.")
    monthly_usd = _limit_field("Per calendar month.")
    member_monthly_usd = _limit_field("Per member per calendar month (jobs they submitted).")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "team spending limits"
        verbose_name_plural = "team spending limits"

    def __str__(self) -> str:
        return f"limits of {self.team}"


class BudgetWarning(models.Model):
    """The 80 % warning of one limit in one period: at most one (``key`` is unique)."""

    key = models.CharField(max_length=200, unique=True)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budget_warnings")
    limit = models.CharField(max_length=16, choices=LimitKind.choices)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True
    )
    period_start = models.DateTimeField()
    period_end = models.DateTimeField(null=True, blank=True)  # None: the job's whole life
    limit_usd = models.DecimalField(max_digits=10, decimal_places=3)
    spent_usd = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"80 % of the {self.get_limit_display()} limit of {self.team}"


class BudgetPause(models.Model):
    """A job being stopped by a limit: opened (and a checkpoint asked) at ``requested_at``, the
    latest checkpoint asked at ``asked_at`` when the newest ready one was ``checkpoint_step``,
    machine released at ``released_at`` (at the latest ``deadline``). One open pause per job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="budget_pauses")
    attempt = models.ForeignKey(Attempt, on_delete=models.SET_NULL, null=True, blank=True)
    limit = models.CharField(max_length=16, choices=LimitKind.choices)
    limit_usd = models.DecimalField(max_digits=10, decimal_places=3)
    spent_usd = models.FloatField()
    period_start = models.DateTimeField()
    requested_at = models.DateTimeField()
    asked_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    checkpoint_step = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(released_at__isnull=True),
                name="one_open_budget_pause_per_job",
            )
        ]
        indexes = [models.Index(fields=["released_at", "deadline"])]

    def __str__(self) -> str:
        return f"{self.job} paused by the {self.get_limit_display()} limit"


class BudgetReservation(models.Model):
    """Budget held for a job's run, written in the transaction that plans its rent.

    ``amount_usd`` is the estimated cost of the rest of the run at planning time and
    ``spent_at_usd`` the job's spend then; what is still held is the estimate minus what the
    job has spent since, never below zero."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="reservation")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="reservations")
    amount_usd = models.FloatField()
    spent_at_usd = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"${self.amount_usd:.2f} for {self.job}"


class ResumeRequest(models.Model):
    """A member's ask that the team's admins resume a budget-paused job (``billing.next_steps``):
    one per pause, keyed by the ``budget_paused`` event that paused the job, so asking again
    notifies no one twice; a later pause can be asked about again."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="resume_requests")
    pause_event = models.OneToOneField(JobEvent, on_delete=models.CASCADE, related_name="+")
    asked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    asked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.asked_by} asks to resume {self.job}"


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


class FlagPeriod(models.TextChoices):
    DAY = "day", "UTC day"
    MONTH = "month", "UTC month"


def _only(subject: str) -> models.Q:
    """SUBJECT set and the other two subjects of a flag empty."""
    subjects = ("attempt", "charge", "period_start")
    q = models.Q(**{f"{subject}__isnull": False})
    for other in subjects:
        if other != subject:
            q &= models.Q(**{f"{other}__isnull": True})
    return q


class DiscrepancyFlag(models.Model):
    """A reconciliation difference outside the tolerance, kept so finance can review it once.

    One per attempt (over-/under-billed, unbilled usage), per unmatched charge, or per team
    and period (a UTC day or month, ``period_start`` its first day): the sum over the
    period's attempts that each matched within the per-attempt tolerance, so a systematic
    overcharge too small to flag any one attempt still shows (``reconcile.flag_periods``).
    The event for notifications is written when an attempt's flag is created, never again.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="discrepancy_flags")
    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.CASCADE, null=True, blank=True, related_name="flag"
    )
    charge = models.OneToOneField(
        Charge, on_delete=models.CASCADE, null=True, blank=True, related_name="flag"
    )
    period = models.CharField(max_length=8, choices=FlagPeriod.choices, blank=True)
    period_start = models.DateField(null=True, blank=True)
    attempts_count = models.PositiveIntegerField(null=True, blank=True)  # a period's, summed
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
                condition=_only("attempt") | _only("charge") | _only("period_start"),
                name="flag_has_one_subject",
            ),
            # The period flag's key: a re-run updates the team's one flag for that period.
            models.UniqueConstraint(
                fields=["team", "period", "period_start"],
                condition=models.Q(period_start__isnull=False),
                name="one_flag_per_team_period",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"

    @property
    def difference_usd(self):
        """Billed minus recorded (a period flag's total difference)."""
        return self.billed_usd - self.recorded_usd
