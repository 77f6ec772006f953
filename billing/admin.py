from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from billing.models import (
    BudgetPause,
    BudgetWarning,
    Charge,
    ChargeItem,
    DiscrepancyFlag,
    InvoiceSync,
    Payment,
    TeamBudget,
)
from billing.services import projected_total
from billing.spend import job_spend
from jobs.admin import JobAdmin
from jobs.models import Job
from nomadgpu.admin_scoping import TeamScopedAdmin


@admin.register(TeamBudget)
class TeamBudgetAdmin(TeamScopedAdmin):
    list_display = ["team", "daily_usd", "weekly_usd", "monthly_usd", "member_monthly_usd"]
    list_select_related = ["team"]
    fieldsets = [
        (
            "Spending limits in USD (empty: none)",
            {
                "fields": ["team", "daily_usd", "weekly_usd", "monthly_usd", "member_monthly_usd"],
                "description": "Calendar periods in the team's time zone; weeks start on "
                "Monday. At 80 % a warning is sent once per limit and period; at 100 % jobs are "
                "checkpointed, their machines released and they wait as 'Paused (budget)'. "
                "A job's own limit is set on the job.",
            },
        )
    ]


@admin.register(BudgetWarning)
class BudgetWarningAdmin(TeamScopedAdmin):
    list_display = ["created_at", "team", "limit", "limit_usd", "spent_usd", "job", "user"]
    list_filter = ["limit", "team"]
    readonly_fields = [f.name for f in BudgetWarning._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(BudgetPause)
class BudgetPauseAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = ["job", "limit", "limit_usd", "spent_usd", "requested_at", "released_at"]
    list_filter = ["limit", "job__team"]
    readonly_fields = [f.name for f in BudgetPause._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


# --- Invoices -------------------------------------------------------------------------------
# Imported ledger rows are read-only here: they change only by re-importing (API or CSV), so
# the admin can never make the invoice disagree with Vast. Finance reviews flags in /finance/.


class ReadOnlyAdmin(TeamScopedAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class ChargeItemInline(admin.TabularInline):
    model = ChargeItem
    extra = 0
    can_delete = False
    fields = ("type", "description", "quantity", "unit", "rate", "rate_unit", "amount")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Charge)
class ChargeAdmin(ReadOnlyAdmin):
    list_display = ("day", "source", "team", "amount", "attempt", "origin", "imported_at")
    list_filter = ("origin", "type", "day")
    search_fields = ("source", "label", "description")
    date_hierarchy = "day"
    inlines = [ChargeItemInline]


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "team", "type", "service", "amount", "invoice_id")
    list_filter = ("type", "service")
    search_fields = ("invoice_id", "description", "source")


@admin.register(InvoiceSync)
class InvoiceSyncAdmin(ReadOnlyAdmin):
    list_display = ("team", "charges_complete_through", "synced_until", "last_run_at", "last_error")


@admin.register(DiscrepancyFlag)
class DiscrepancyFlagAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "team", "kind", "recorded_usd", "billed_usd", "reason", "status")
    list_filter = ("kind", "status")
    search_fields = ("reason", "note")


class JobWithSpendAdmin(JobAdmin):
    """The job admin with billing's columns: jobs knows nothing of money (billing reads it)."""

    list_display = [*JobAdmin.list_display[:4], "spend_so_far", *JobAdmin.list_display[4:]]
    readonly_fields = ["spend_so_far", "projected_total"]

    @admin.display(description="spend so far ($)")
    def spend_so_far(self, job: Job) -> str:
        return f"{job_spend(job, now=timezone.now()).total:.4f}"

    @admin.display(description="projected total ($)")
    def projected_total(self, job: Job) -> str:
        return f"{projected_total(job, now=timezone.now()):.4f}"


admin.site.unregister(Job)
admin.site.register(Job, JobWithSpendAdmin)
