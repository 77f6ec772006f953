"""Spending limits (per team per day / week / month, per member per month; the per-job limit
is ``Job.budget_usd``), the warnings sent, the pauses made and the budget reserved for rents.

Invoices, charges and reconciliation arrive with the invoices issue."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models import Attempt, Job
from nomadgpu.models import Team


class LimitKind(models.TextChoices):
    JOB = "job", "job"
    DAY = "day", "daily"
    WEEK = "week", "weekly"
    MONTH = "month", "monthly"
    MEMBER_MONTH = "member_month", "per-member monthly"


def _limit_field(help_text: str) -> models.DecimalField:
    return models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, help_text=help_text
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
    limit_usd = models.DecimalField(max_digits=10, decimal_places=2)
    spent_usd = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"80 % of the {self.get_limit_display()} limit of {self.team}"


class BudgetPause(models.Model):
    """A job being stopped by a limit: checkpoint asked at ``requested_at``, machine released at
    ``released_at`` (at the latest ``deadline``). One open pause per job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="budget_pauses")
    attempt = models.ForeignKey(Attempt, on_delete=models.SET_NULL, null=True, blank=True)
    limit = models.CharField(max_length=16, choices=LimitKind.choices)
    limit_usd = models.DecimalField(max_digits=10, decimal_places=2)
    spent_usd = models.FloatField()
    period_start = models.DateTimeField()
    requested_at = models.DateTimeField()
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
