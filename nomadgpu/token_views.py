"""The member's personal API tokens page: list, create (the token is shown once), revoke."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from nomadgpu import api_tokens


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="Where it will be used, e.g. “laptop CLI” or “CI”."
    )


@login_required
def tokens(request):
    """GET lists the user's tokens; POST creates one and shows it on this response only."""
    new_token = None
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, new_token = api_tokens.create_token(
            user=request.user, name=form.cleaned_data["name"], now=timezone.now()
        )
        form = TokenForm()
    context = {
        "form": form,
        "new_token": new_token,
        "tokens": request.user.api_tokens.all(),
        "api_url": request.build_absolute_uri("/").rstrip("/"),
    }
    return render(request, "nomadgpu/tokens.html", context)


@login_required
@require_POST
def revoke(request, token_id: int):
    row = api_tokens.revoke_token(user=request.user, token_id=token_id, now=timezone.now())
    messages.success(request, f"Token “{row.name}” revoked; it no longer authenticates.")
    return redirect("account-tokens")
