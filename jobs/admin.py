from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils import timezone

from jobs import attention, lifecycle, spending
from jobs.code import job_secrets
from jobs.models import (
    Attempt,
    Checkpoint,
    Interruption,
    Job,
    JobEvent,
    JobState,
    LossPoint,
    OfferClaim,
    Racer,
    RacerState,
    StagedObject,
    WorkdirPack,
)
from jobs.recovery_times import recovery_times
from jobs.spec import RESOLVED_AT_SUBMIT, JobSpec, MissingSecret, ValidationError, check_team_refs
from jobs.spending import BudgetExceeded
from nomadgpu.admin_scoping import TeamScopedAdmin
from nomadgpu.humanize import duration, money

# The workdir is stored as submit resolved it (a git ref's commit): shown, not edited.
SPEC_FIELDS = tuple(name for name in JobSpec.model_fields if name not in RESOLVED_AT_SUBMIT)


def spec_error_text(error: dict) -> str:
    """One pydantic error as the admin shows it under its field: "requirements: unknown key
    'gpu_name'", "requirements.num_gpus: Input should be less than or equal to 16"."""
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        return f"{'.'.join(loc[:-1]) or 'spec'}: unknown key {loc[-1]!r}"
    return f"{'.'.join(loc)}: {error['msg']}"


class JobAdminForm(forms.ModelForm):
    """A job edited here passes the same ``JobSpec`` as one submitted by the form, the API or
    the CLI (``jobs.spec``): a typo'd key in ``requirements`` is refused under its field, not
    stored for the rent loop to trip over. What is saved is the spec's normalised data."""

    class Meta:
        model = Job
        # Every column but the sealed data key; JobAdmin leaves out its read-only ones too.
        fields = [
            f.name for f in Job._meta.fields if f.editable and f.name not in ("id", "data_key")
        ]

    def clean(self):
        data = super().clean()
        present = {name: data[name] for name in SPEC_FIELDS if name in data}
        if len(present) < len(SPEC_FIELDS):
            return data  # a field failed its own check first: its error is already shown
        try:
            spec = JobSpec.model_validate(present)
            if data.get("team") is not None:
                check_team_refs(spec, team=data["team"])  # as at submit: the team has them
        except ValidationError as exc:
            for error in exc.errors():
                field = str(error["loc"][0]) if error["loc"] else None
                self.add_error(field if field in self.fields else None, spec_error_text(error))
            return data
        except MissingSecret as exc:
            self.add_error(exc.field, str(exc))
            return data
        return {**data, **spec.job_fields()}


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "kind", "message", "data"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(TeamScopedAdmin):
    """Jobs are submitted through ``jobs.spec.submit_spec`` (the portal, the API, the CLI:
    budget check, data key, first rent) and move only through ``jobs.lifecycle``: here a job
    is edited, cancelled or resumed, never added, and its state and submitter are read-only."""

    form = JobAdminForm
    # Who submitted it is history, like created_at (and may be gone: SET_NULL).
    readonly_fields = ["state", "created_by", *RESOLVED_AT_SUBMIT]
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

    def has_add_permission(self, request) -> bool:
        return False

    def save_model(self, request, obj: Job, form, change: bool) -> None:
        """Save; a job held for attention that now validates is queued again (after commit, as
        every transition's side effects)."""
        super().save_model(request, obj, form, change)
        if obj.state == JobState.NEEDS_ATTENTION:
            fixed = attention.requeue_if_fixed(
                obj, by=f"{request.user} (admin)", now=timezone.now()
            )
            if fixed:
                self.message_user(request, f"{obj} is fixed: it is queued and renting again.")

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


class RacerInline(admin.TabularInline):
    """A hedged rent's racers (``jobs.renting.race``): read only, they move with their race."""

    model = Racer
    extra = 0
    can_delete = False
    fields = ["position", "state", "end_reason", "instance_id", "machine_id", "offer_id", "cost"]
    readonly_fields = fields

    @admin.display(description="cost so far ($)")
    def cost(self, racer: Racer) -> str:
        return racer_cost_text(racer)

    def has_add_permission(self, request, obj=None) -> bool:
        return False


def racer_cost_text(racer: Racer) -> str:
    """What RACER has cost, as billing counts it (``jobs.spending``'s ``racer_cost``)."""
    if racer.state == RacerState.WON:
        return "the attempt's"
    cost = spending.gate().racer_cost(racer, now=timezone.now())
    return "—" if cost is None else money(cost)


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
    # The log tail is shown with the job's secret values masked (jobs.code.job_secrets), in its
    # place.
    exclude = ["token_digest", "log_tail"]
    readonly_fields = [
        "masked_log_tail" if f.name == "log_tail" else f.name
        for f in Attempt._meta.fields
        if f.name != "token_digest"
    ]
    inlines = [RacerInline, CheckpointInline]

    @admin.display(description="log tail")
    def masked_log_tail(self, attempt: Attempt) -> str:
        return job_secrets.mask_for(attempt.job, attempt.log_tail)

    @admin.display(description="last heartbeat (s ago)")
    def heartbeat_age(self, attempt: Attempt) -> str:
        if attempt.last_heartbeat_at is None:
            return "—"
        return f"{(timezone.now() - attempt.last_heartbeat_at).total_seconds():.0f}"

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Racer)
class RacerAdmin(TeamScopedAdmin):
    """One instance of a hedged rent; the win and the ends happen in ``jobs.renting.race_end``
    and ``jobs.racers``: shown, never edited."""

    team_path = "attempt__job__team"
    list_display = [
        "__str__", "state", "instance_id", "machine_id", "offer_id", "end_reason", "cost",
        "created_at", "ended_at",
    ]  # fmt: skip
    list_filter = ["state", "attempt__job__team"]
    search_fields = ["label", "instance_id", "machine_id", "offer_id"]
    list_select_related = ["attempt__job"]
    exclude = ["token_digest"]
    readonly_fields = [f.name for f in Racer._meta.fields if f.name != "token_digest"]

    @admin.display(description="cost so far ($)")
    def cost(self, racer: Racer) -> str:
        return racer_cost_text(racer)

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(OfferClaim)
class OfferClaimAdmin(TeamScopedAdmin):
    """The per-offer claims taken before every create (``jobs.renting.offer_claims``)."""

    team_path = "attempt__job__team"
    list_display = ["offer_id", "attempt", "racer", "claimed_at", "released_at"]
    list_filter = ["attempt__job__team"]
    search_fields = ["offer_id"]
    readonly_fields = ["offer_id", "attempt", "racer", "claimed_at", "released_at"]

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
        "drill",
        "detection_s",
        "back_on_machine_s",
        "training_again_s",
        "step_reached",
        "resumed_step",
        "cancelled_before_recovery",
    ]
    list_filter = ["cause", "drill", "cancelled_before_recovery", "job__team"]
    search_fields = ["job__name", "detail"]
    date_hierarchy = "detected_at"
    list_select_related = ["job"]
    readonly_fields = [f.name for f in Interruption._meta.fields]

    @admin.display(description="detected after (s)")
    def detection_s(self, item: Interruption) -> str:
        if item.last_heartbeat_at is None:
            return "—"
        return f"{(item.detected_at - item.last_heartbeat_at).total_seconds():.0f}"

    @admin.display(description="back on a machine after")
    def back_on_machine_s(self, item: Interruption) -> str:
        return duration(recovery_times(item).back_on_machine_s)

    @admin.display(description="training again after")
    def training_again_s(self, item: Interruption) -> str:
        return duration(recovery_times(item).training_again_s)

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


@admin.register(WorkdirPack)
class WorkdirPackAdmin(TeamScopedAdmin):
    """Code packs are made by uploads (the CLI, the portal's form) and named by their content:
    read-only here; a pack may be in use by any job of its team, so none is deleted."""

    list_display = ["sha256", "team", "size", "encrypted", "state", "created_at", "ready_at"]
    list_filter = ["state", "encrypted", "team"]
    search_fields = ["sha256"]
    list_select_related = ["team"]
    exclude = ["data_key"]
    readonly_fields = [f.name for f in WorkdirPack._meta.fields if f.name != "data_key"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(StagedObject)
class StagedObjectAdmin(TeamScopedAdmin):
    """Staged model files are made by the staging task (``jobs.staging``) and named by what
    they hold: read-only here; any job of the team with the same entry reuses one."""

    list_display = ["source", "team", "state", "files_done", "files_total", "bytes_total"]
    list_filter = ["state", "kind", "encrypted", "team"]
    search_fields = ["source", "repo", "commit"]
    list_select_related = ["team"]
    exclude = ["data_key"]
    readonly_fields = [f.name for f in StagedObject._meta.fields if f.name != "data_key"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
