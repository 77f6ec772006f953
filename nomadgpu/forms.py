"""Forms shared by the admin and the portal: a team secret's value, write-only.

A value is typed into a password input, or, for a multi-line value (a deploy key's PEM: a
password input drops line breaks), into a text area; neither is ever filled in from the stored
value, not even masked (a short token's last characters are most of it). On a change, leaving
both empty keeps the stored value.
"""

from __future__ import annotations

from typing import Any

from django import forms

from nomadgpu import team_secrets


class WriteOnlyTextarea(forms.Textarea):
    """A text area that is always rendered empty, even when its form comes back with errors
    (a plain one would echo the value just typed into the page)."""

    def format_value(self, value):
        return None


def secret_value_field() -> forms.CharField:
    """The one-line value: a password input that never renders a value back."""
    return forms.CharField(
        label="Value",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )


def secret_lines_field() -> forms.CharField:
    """The multi-line value (a PEM key), for what a password input cannot hold."""
    return forms.CharField(
        label="Or a multi-line value",
        required=False,
        strip=False,
        help_text="A deploy key's PEM, with its line breaks. Never shown again.",
        widget=WriteOnlyTextarea(attrs={"rows": 3, "autocomplete": "off", "spellcheck": "false"}),
    )


def chosen_value(form: forms.Form, cleaned: dict[str, Any], *, keep: str = "") -> str:
    """The value FORM was given (the text area wins when both are filled), or KEEP (the stored
    value of a secret being changed) when neither is; an error on ``value`` when there is none
    at all or it is too long."""
    value = cleaned.get("value_lines") or cleaned.get("value") or ""
    if not value.strip():
        if keep:
            return keep
        form.add_error("value", "A secret needs a value.")
    elif len(value) > team_secrets.VALUE_MAX_CHARS:
        form.add_error("value", f"At most {team_secrets.VALUE_MAX_CHARS // 1024} KiB.")
    return value
