from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from nomadgpu import crypto, services
from nomadgpu.admin_scoping import (
    CreatedAtReadOnly,
    SecretFieldsForm,
    TeamScopedAdmin,
    clear_secret_field,
)
from nomadgpu.forms import chosen_value, secret_lines_field, secret_value_field
from nomadgpu.humanize import duration
from nomadgpu.models import (
    ApiToken,
    IngestOutage,
    Membership,
    Role,
    ServiceHeartbeat,
    Team,
    TeamSecret,
)
from nomadgpu.permissions import is_any_team_admin, users_visible_to


class TeamForm(SecretFieldsForm):
    secret_fields = Team.SECRET_FIELDS
    clear_vast_api_key = clear_secret_field("Vast API key")
    clear_telegram_bot_token = clear_secret_field("Telegram bot token")
    clear_storage_access_key_id = clear_secret_field("storage access key id")
    clear_storage_secret_access_key = clear_secret_field("storage secret key")

    class Meta:
        model = Team
        fields = "__all__"


class AddMemberForm(forms.Form):
    username = forms.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
    email = forms.EmailField(required=False, help_text="Optional; no mail is sent.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self) -> str:
        username = self.cleaned_data["username"]
        if get_user_model().objects.filter(username__iexact=username).exists():
            raise forms.ValidationError(
                f"A user named {username!r} already exists: choose another name (a superuser "
                "can add an existing user in the team's member list)."
            )
        return username


def set_password_link(user, base_url: str = "") -> str:
    """USER's one-time set-password link (BASE_URL + path), or "" once they have a password."""
    found = services.set_password_path(user)
    return f"{base_url}{found}" if found else ""


class MembershipInline(CreatedAtReadOnly, admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at", "password_link"]
    readonly_fields = ["password_link"]

    @admin.display(description="set-password link")
    def password_link(self, membership: Membership) -> str:
        if not membership.pk:
            return ""
        link = set_password_link(membership.user, settings.SITE_URL)
        return format_html('<a href="{0}">{0}</a>', link) if link else "password set"

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user":
            kwargs["queryset"] = users_visible_to(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    # Django's model permissions would hide the inline from team admins (they hold none):
    # the team page itself is already scoped to their teams (TeamScopedAdmin).
    def _is_team_admin(self, request) -> bool:
        user = request.user
        return user.is_active and (user.is_superuser or is_any_team_admin(user))

    def has_view_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def has_add_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)


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

    def get_urls(self):
        # Before the defaults: their "<path:object_id>/" would take "5/add-member/" too.
        add_member = self.admin_site.admin_view(self.add_member_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_add_member"
        return [path("<path:object_id>/add-member/", add_member, name=name), *super().get_urls()]

    def add_member_view(self, request, object_id: str):
        """Create a user in this team and show their one-time set-password link."""
        team = self.get_object(request, object_id)
        if team is None or not self.has_change_permission(request, team):
            raise Http404(f"No team with id {object_id!r}.")
        form = AddMemberForm(request.POST or None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": team,
            "title": f"Add a member to {team}",
            "form": form,
        }
        if request.method == "POST" and form.is_valid():
            user = services.add_member(team=team, **form.cleaned_data)
            context |= {
                "title": f"{user.get_username()} added to {team}",
                "added": user,
                "role": Role(form.cleaned_data["role"]).label,
                "link": set_password_link(user, request.build_absolute_uri("/").rstrip("/")),
                "valid_for": duration(settings.PASSWORD_RESET_TIMEOUT),
            }
            return TemplateResponse(request, "admin/nomadgpu/team/member_added.html", context)
        return TemplateResponse(request, "admin/nomadgpu/team/add_member.html", context)

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

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user":
            kwargs["queryset"] = users_visible_to(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class TeamSecretAdminForm(forms.ModelForm):
    """The value is write-only (``nomadgpu.forms``): required when adding, kept when left
    blank on a change, never rendered back."""

    value = secret_value_field()
    value_lines = secret_lines_field()

    class Meta:
        model = TeamSecret
        fields = ["team", "name"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["value"].help_text = (
            "Stored encrypted, never shown. Leave blank to keep it; type a new one to replace it."
            if self.instance.pk
            else "Stored encrypted; it is never shown again."
        )

    def clean(self):
        data = super().clean()
        keep = str(self.instance.value) if self.instance.pk else ""
        data["value"] = chosen_value(self, data, keep=keep)
        return data

    def save(self, commit: bool = True):
        self.instance.value = self.cleaned_data["value"]
        return super().save(commit)


@admin.register(TeamSecret)
class TeamSecretAdmin(TeamScopedAdmin):
    """A team's secrets by name; the values go only to the agents of jobs that name them."""

    form = TeamSecretAdminForm
    list_display = ["name", "team", "updated_at"]
    list_filter = ["team"]
    search_fields = ["name", "team__name"]
    list_select_related = ["team"]
    readonly_fields = ["updated_at"]
    fields = ["team", "name", "value", "value_lines", "created_at", "updated_at"]

    def get_queryset(self, request):
        # The list and the history never need the sealed values: nothing is decrypted for them.
        return super().get_queryset(request).defer("value")


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


@admin.register(IngestOutage)
class IngestOutageAdmin(admin.ModelAdmin):
    """Times the agent API took no heartbeats (``nomadgpu.ingest``): recorded, never edited."""

    list_display = ["cause", "started_at", "ended_at", "seconds"]
    list_filter = ["cause"]
    readonly_fields = ["cause", "started_at", "ended_at"]

    @admin.display(description="seconds")
    def seconds(self, outage: IngestOutage) -> float | None:
        end = outage.ended_at or timezone.now()
        return round((end - outage.started_at).total_seconds(), 1)

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
