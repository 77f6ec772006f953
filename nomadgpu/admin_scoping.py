"""Admin access by team role: a team admin manages their teams' objects and nothing else.

Superusers see everything. Others see only rows of teams where they hold the admin role; any
other row is reported as missing (404), never as forbidden. ``created_at`` is shown read-only
on every page and inline: it records when a row was made, and an editable one would let the
history say anything.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import Http404

from nomadgpu import crypto
from nomadgpu.models import Role, Team
from nomadgpu.permissions import teams_with_role

CREATED_AT = "created_at"


def with_created_at_read_only(model, fields) -> tuple[str, ...]:
    """FIELDS, plus ``created_at`` when MODEL has that column."""
    fields = tuple(fields)
    has_it = any(f.name == CREATED_AT for f in model._meta.fields)
    return (*fields, CREATED_AT) if has_it and CREATED_AT not in fields else fields


class CreatedAtReadOnly:
    """Mixin for a ModelAdmin or an inline: ``created_at`` is never a form field."""

    def get_readonly_fields(self, request, obj=None):
        return with_created_at_read_only(self.model, super().get_readonly_fields(request, obj))


class TeamScopedAdmin(CreatedAtReadOnly, admin.ModelAdmin):
    team_path = "team"  # lookup from this model to its Team; "" when the model is Team

    def admin_teams(self, request):
        return teams_with_role(request.user, Role.ADMIN)

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        lookup = f"{self.team_path}__in" if self.team_path else "pk__in"
        return queryset.filter(**{lookup: self.admin_teams(request)})

    def _is_team_admin(self, request) -> bool:
        user = request.user
        return user.is_active and (user.is_superuser or self.admin_teams(request).exists())

    def has_module_permission(self, request) -> bool:
        return self._is_team_admin(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def has_add_permission(self, request) -> bool:
        return self._is_team_admin(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._is_team_admin(request)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.related_model is Team and not request.user.is_superuser:
            kwargs["queryset"] = self.admin_teams(request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        # Django redirects to the index with "doesn't exist"; another team's object must be a
        # plain 404 so ids of other teams cannot be probed.
        raise Http404(f"No {opts.verbose_name} with id {object_id!r}.")


def clear_secret_field(label: str) -> forms.BooleanField:
    return forms.BooleanField(required=False, label=f"Clear the stored {label}")


class SecretFieldsForm(forms.ModelForm):
    """Secret columns are write-only: shown masked, kept when left blank, cleared on request.

    Subclasses declare a ``clear_<name>`` BooleanField per secret (``clear_secret_field``).
    """

    secret_fields: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.secret_fields:
            current = getattr(self.instance, name, "") if self.instance.pk else ""
            field = self.fields[name]
            field.widget = forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"})
            field.required = False
            field.help_text = (
                f"Stored encrypted: {crypto.mask(current)}. Leave blank to keep it."
                if current
                else "Not set. Stored encrypted."
            )

    def clean(self):
        data = super().clean()
        for name in self.secret_fields:
            if data.get(f"clear_{name}"):
                data[name] = ""
            elif not data.get(name) and self.instance.pk:
                data[name] = getattr(self.instance, name)
        return data
