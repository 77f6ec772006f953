from __future__ import annotations

from django.contrib import admin

from jobs.models import Job, JobEvent
from nomadgpu.admin_scoping import TeamScopedAdmin


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "kind", "message", "data"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(TeamScopedAdmin):
    list_display = ["name", "team", "state", "created_by", "created_at", "updated_at"]
    list_filter = ["state", "team"]
    search_fields = ["name", "command", "image", "created_by__username"]
    list_select_related = ["team", "created_by"]
    date_hierarchy = "created_at"
    inlines = [JobEventInline]


@admin.register(JobEvent)
class JobEventAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = ["created_at", "job", "kind", "message"]
    list_filter = ["kind", "job__team"]
    search_fields = ["job__name", "message"]
    list_select_related = ["job"]
    readonly_fields = ["job", "created_at", "kind", "message", "data"]

    def has_add_permission(self, request) -> bool:
        return False
