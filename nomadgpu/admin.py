from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from nomadgpu import crypto
from nomadgpu.admin_scoping import SecretFieldsForm, TeamScopedAdmin, clear_secret_field
from nomadgpu.models import ApiToken, Membership, ServiceHeartbeat, Team


class TeamForm(SecretFieldsForm):
    secret_fields = Team.SECRET_FIELDS
    clear_vast_api_key = clear_secret_field("Vast API key")
    clear_telegram_bot_token = clear_secret_field("Telegram bot token")
    clear_storage_access_key_id = clear_secret_field("storage access key id")
    clear_storage_secret_access_key = clear_secret_field("storage secret key")

    class Meta:
        model = Team
        fields = "__all__"


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(TeamScopedAdmin):
    team_path = ""
    form = TeamForm
    list_display = ["name", "slug", "time_zone", "member_count", "vast_key", "public_status_page"]
    list_filter = ["public_status_page", "time_zone"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]
    fieldsets = [
        (None, {"fields": ["name", "slug", "time_zone", "public_status_page"]}),
        (
            "Savings report",
            {"fields": ["reference_name", "reference_rate_usd_per_hour", "reference_speed_factor"]},
        ),
        ("Vast.ai", {"fields": ["vast_url", "vast_api_key", "clear_vast_api_key"]}),
        (
            "Object storage",
            {
                "fields": [
                    "storage_endpoint_url",
                    "storage_bucket",
                    "storage_access_key_id",
                    "clear_storage_access_key_id",
                    "storage_secret_access_key",
                    "clear_storage_secret_access_key",
                ]
            },
        ),
        ("Telegram", {"fields": ["telegram_bot_token", "clear_telegram_bot_token"]}),
    ]

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser  # new teams are created by the operator

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    @admin.display(description="members")
    def member_count(self, team: Team) -> int:
        return team.memberships.count()

    @admin.display(description="Vast API key")
    def vast_key(self, team: Team) -> str:
        return crypto.mask(team.vast_api_key) or "— (server default)"


@admin.register(Membership)
class MembershipAdmin(TeamScopedAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "user__email", "team__name"]
    list_select_related = ["user", "team"]


@admin.register(ServiceHeartbeat)
class ServiceHeartbeatAdmin(admin.ModelAdmin):
    list_display = ["name", "last_seen_at", "age", "count"]
    readonly_fields = ["name", "last_seen_at", "count", "detail"]

    @admin.display(description="seconds since")
    def age(self, beat: ServiceHeartbeat) -> float:
        return round((timezone.now() - beat.last_seen_at).total_seconds(), 1)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by their owner in the portal (shown once); here they are seen and
    revoked. Only superusers: a token belongs to a person, not to a team."""

    list_display = ["name", "user", "masked", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "user__username", "prefix"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "masked", "created_at", "last_used_at", "revoked_at"]
    fields = readonly_fields
    actions = ["revoke"]

    @admin.display(description="token")
    def masked(self, token: ApiToken) -> str:
        return f"ngpt_{token.prefix}…"

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        count = queryset.filter(revoked_at=None).update(revoked_at=timezone.now())
        self.message_user(request, f"{count} token(s) revoked.")

    def has_add_permission(self, request) -> bool:
        return False

    def has_module_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser
