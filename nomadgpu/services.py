"""Team services: membership-driven admin access, adding a member, and the demo team of
``make run``.

A new member gets no password from the admin: they get a set-password link made with Django's
own password-reset tokens (``default_token_generator``). The link works once: the token is a
hash over the user's password hash, which setting the password changes; and it expires after
``PASSWORD_RESET_TIMEOUT`` (Django's default, three days). While the member has not set a
password yet, a team admin can show a fresh link again (the admin's team page, the portal's).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.db import transaction
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from nomadgpu.models import Membership, Role, Team

DEMO_USERS = (("admin", Role.ADMIN), ("member", Role.MEMBER), ("finance", Role.FINANCE))


def sync_staff_access(user) -> None:
    """Give USER the admin site exactly when they administer a team (superusers keep it).

    What they may do there is decided per object by their roles (``nomadgpu.admin_scoping``),
    so no Django permission groups need to be kept in step.
    """
    if user.is_superuser:
        return
    is_team_admin = Membership.objects.filter(user=user, role=Role.ADMIN).exists()
    if user.is_staff != is_team_admin:
        user.is_staff = is_team_admin
        user.save(update_fields=["is_staff"])


@transaction.atomic
def add_member(*, team: Team, username: str, email: str = "", role: str = Role.MEMBER):
    """Create USERNAME without a password and make them a member of TEAM in ROLE; returns the
    user. They choose their password through ``set_password_path``."""
    user = get_user_model().objects.create_user(username=username, email=email)  # unusable
    Membership.objects.create(user=user, team=team, role=role)
    return user


def set_password_path(user) -> str | None:
    """The path of USER's one-time set-password link; None once they have a password."""
    if user.has_usable_password():
        return None
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    return reverse("set-password", args=[uid, default_token_generator.make_token(user)])


@dataclass(frozen=True)
class DemoUser:
    username: str
    role: str
    password: str | None  # only when created by this call


@transaction.atomic
def ensure_demo_team() -> tuple[Team, list[DemoUser]]:
    """Create the demo team and one user per role (admin, member, finance) once; a user's
    password is returned only by the call that created it."""
    team, _ = Team.objects.get_or_create(
        slug="demo", defaults={"name": "Demo team", "public_status_page": True}
    )
    return team, [_ensure_demo_user(team, name, role) for name, role in DEMO_USERS]


def _ensure_demo_user(team: Team, username: str, role: str) -> DemoUser:
    User = get_user_model()
    password = None
    user = User.objects.filter(username=username).first()
    if user is None:
        password = secrets.token_urlsafe(12)
        # The admin is the operator: a superuser, who also creates teams.
        create = User.objects.create_superuser if role == Role.ADMIN else User.objects.create_user
        user = create(username=username, email="", password=password)
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": role})
    return DemoUser(username, role, password)
