"""The page behind a new member's one-time set-password link (``services.set_password_path``)."""

from __future__ import annotations

from django.contrib.auth.views import PasswordResetConfirmView
from django.contrib.messages.views import SuccessMessageMixin
from django.urls import reverse_lazy


class SetPasswordView(SuccessMessageMixin, PasswordResetConfirmView):
    """Django's password-reset confirmation: the member chooses a password and is signed in.
    The token dies with the unusable password it was made from, so the link works once."""

    template_name = "registration/set_password.html"
    post_reset_login = True
    success_url = reverse_lazy("dashboard")
    success_message = "Your password is set and you are signed in."
