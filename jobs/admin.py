from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Attempt, Checkpoint, Interruption, Job, JobEvent, LossPoint
from jobs.spending import BudgetExceeded
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
    list_display = [
        "name",
        "team",
        "state",
        "budget_usd",
        "created_by",
        "created_at",
        "updated_at",
    ]
    list_filter = ["state", "team"]
    search_fields = ["name", "command", "image", "created_by__username"]
    list_select_related = ["team", "created_by"]
    date_hierarchy = "created_at"
    exclude = ["data_key"]
    inlines = [JobEventInline]
    actions = ["cancel_jobs", "resume_jobs"]

    @admin.action(description="Resume the selected budget-paused jobs (from their checkpoints)")
    def resume_jobs(self, request, queryset) -> None:
        resumed = 0
        for job in queryset:
            try:
                lifecycle.resume_job(job.pk, by=f"{request.user} (admin)", now=timezone.now())
                resumed += 1
            except BudgetExceeded as exc:
                self.message_user(request, f"{job}: {exc}", level="warning")
        self.message_user(request, f"Resumed {resumed} job(s).")

    @admin.action(description="Cancel the selected jobs (releases their machines)")
    def cancel_jobs(self, request, queryset) -> None:
        cancelled, refused = 0, []
        for job in queryset:
            try:
                lifecycle.cancel_job(job.pk, now=timezone.now(), by=f"by {request.user} (admin)")
                cancelled += 1
            except lifecycle.IllegalTransition as exc:
                refused.append(str(exc))
        self.message_user(request, f"Cancelled {cancelled} job(s).")
        for reason in refused:
            self.message_user(request, reason, level="warning")


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


class CheckpointInline(admin.TabularInline):
    model = Checkpoint
    extra = 0
    can_delete = False
    fields = ["step", "state", "size", "encrypted", "ready_at", "key"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Attempt)
class AttemptAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = [
        "__str__",
        "state",
        "instance_id",
        "gpu_name",
        "dph_base",
        "step",
        "heartbeat_age",
        "gpu_ok",
        "created_at",
    ]
    list_filter = ["state", "gpu_name", "job__team"]
    search_fields = ["job__name", "label", "instance_id", "machine_id"]
    list_select_related = ["job"]
    exclude = ["token_digest"]
    readonly_fields = [f.name for f in Attempt._meta.fields if f.name != "token_digest"]
    inlines = [CheckpointInline]

    @admin.display(description="last heartbeat (s ago)")
    def heartbeat_age(self, attempt: Attempt) -> str:
        if attempt.last_heartbeat_at is None:
            return "—"
        return f"{(timezone.now() - attempt.last_heartbeat_at).total_seconds():.0f}"

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = ["job", "step", "state", "size", "encrypted", "attempt", "ready_at"]
    list_filter = ["state", "encrypted", "job__team"]
    search_fields = ["job__name", "key", "sha256"]
    list_select_related = ["job", "attempt"]
    readonly_fields = [f.name for f in Checkpoint._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Interruption)
class InterruptionAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = [
        "job",
        "cause",
        "detected_at",
        "detection_s",
        "back_after_s",
        "step_reached",
        "resumed_step",
        "cancelled_before_recovery",
    ]
    list_filter = ["cause", "cancelled_before_recovery", "job__team"]
    search_fields = ["job__name", "detail"]
    date_hierarchy = "detected_at"
    list_select_related = ["job"]
    readonly_fields = [f.name for f in Interruption._meta.fields]

    @admin.display(description="detected after (s)")
    def detection_s(self, item: Interruption) -> str:
        if item.last_heartbeat_at is None:
            return "—"
        return f"{(item.detected_at - item.last_heartbeat_at).total_seconds():.0f}"

    @admin.display(description="running again after (s)")
    def back_after_s(self, item: Interruption) -> str:
        if item.running_again_at is None:
            return "—"
        return f"{(item.running_again_at - item.detected_at).total_seconds():.0f}"

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(LossPoint)
class LossPointAdmin(TeamScopedAdmin):
    team_path = "job__team"
    list_display = ["job", "step", "loss", "created_at"]
    list_filter = ["job__team"]
    search_fields = ["job__name"]
    list_select_related = ["job"]
    readonly_fields = [f.name for f in LossPoint._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
