"""The Team page's secrets (team admins): add or replace a value by name, delete by name
(the views are ``portal.views.team_secret_set`` and ``team_secret_delete``).

The page lists names and when each was last set, never a value; the form's value fields are
write-only (``nomadgpu.forms``). Members see the names where they pick them, on the new-job form.
Another team's page is 404, a member who is not the team's admin gets 403.
"""

from __future__ import annotations

from django import forms
from django.core.validators import RegexValidator
from django.http import HttpRequest

from nomadgpu.forms import chosen_value, secret_lines_field, secret_value_field
from nomadgpu.models import TeamSecret
from nomadgpu.permissions import can_manage_team


class TeamSecretForm(forms.Form):
    """Name and value of a secret to add, or to replace (a name the team already has)."""

    name = forms.CharField(
        max_length=64,
        help_text="An environment variable name, e.g. HF_TOKEN; the same name replaces the value.",
        validators=[
            RegexValidator(
                r"^[A-Za-z_][A-Za-z0-9_]*$",
                "A secret's name is an environment variable name: letters, digits and _.",
            )
        ],
    )
    value = secret_value_field()
    value_lines = secret_lines_field()

    def clean(self):
        data = super().clean()
        data["value"] = chosen_value(self, data)
        return data


def secrets_context(request: HttpRequest, team, form: TeamSecretForm | None = None) -> dict:
    """The Team page's secrets section: names and dates for the team's admins, else nothing."""
    if not can_manage_team(request.user, team):
        return {"manages_secrets": False}
    rows = TeamSecret.objects.filter(team=team).defer("value").order_by("name")
    return {
        "manages_secrets": True,
        "team_secrets": list(rows),
        "secret_form": form or TeamSecretForm(),
    }
