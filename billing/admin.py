from __future__ import annotations

from django.contrib import admin
from django.db.models import Prefetch
from django.utils import timezone

from billing.cost import charges_prefetch, job_cost
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
from jobs import lifecycle
from jobs.admin import JobAdmin
from jobs.models import Attempt, Job
from nomadgpu.admin_scoping import TeamScopedAdmin
from nomadgpu.humanize import money


@admin.register(TeamBudget)
class TeamBudgetAdmin(TeamScopedAdmin):
    list_display = ["team", "daily_usd", "weekly_usd", "monthly_usd", "member_monthly_usd"]
    list_select_related = ["team"]
    fieldsets = [
        (
            "Spending limits in USD, to the tenth of a cent (empty: none)",
            {
                "fields": ["team", "daily_usd", "weekly_usd", "monthly_usd", "member_monthly_usd"],
                "description": "Calendar periods in the team's time zone; weeks start on "
                "Monday. At 80 % a warning is sent once per limit and period; just before "
                "100 % (a budget pass ahead of the crossing) jobs are checkpointed, their "
                "machines released and they wait as 'Paused (budget)'. "
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
    list_filter = ("kind", "status", "period")
    search_fields = ("reason", "note")


class JobWithSpendAdmin(JobAdmin):
    """The job admin with billing's columns: jobs knows nothing of money (billing reads it).
    The cost is the one every surface shows (``billing.cost.job_cost``), with its label."""

    list_display = [*JobAdmin.list_display[:4], "cost", *JobAdmin.list_display[4:]]
    readonly_fields = [*JobAdmin.readonly_fields, "cost", "projected_total"]

    def get_queryset(self, request):
        # The cost reads each attempt's charges: three queries for the page, not three a row.
        attempts = Attempt.objects.prefetch_related(charges_prefetch())
        return super().get_queryset(request).prefetch_related(Prefetch("attempts", attempts))

    @admin.display(description="cost")
    def cost(self, job: Job) -> str:
        """ "$0.0191 (recorded)", "$0.0180 (invoiced)" or "$0.0141 (partly invoiced: $0.0098
        invoiced + $0.0043 recorded)" (``JobCost.described``)."""
        return job_cost(job, now=timezone.now()).described

    @admin.display(description="projected total")
    def projected_total(self, job: Job) -> str:
        """The expected total by the money rule; the cost itself once the job ended."""
        if lifecycle.is_terminal(job.state):
            return self.cost(job)
        total = projected_total(job, now=timezone.now())
        return "- (the job's stored spec does not validate)" if total is None else money(total)


admin.site.unregister(Job)
admin.site.register(Job, JobWithSpendAdmin)
