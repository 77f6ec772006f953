from __future__ import annotations

from django.contrib import admin

from billing.models import BudgetPause, BudgetWarning, TeamBudget
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
