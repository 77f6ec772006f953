"""Team services: membership-driven admin access and the demo team of ``make run``."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.db import transaction

from nomadgpu.models import Membership, Role, Team


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
def ensure_demo_team(*, username: str = "admin") -> tuple[Team, str | None]:
    """Create the demo team and its admin user once; return the password only when created."""
    team, _ = Team.objects.get_or_create(
        slug="demo", defaults={"name": "Demo team", "public_status_page": True}
    )
    User = get_user_model()
    password = None
    user = User.objects.filter(username=username).first()
    if user is None:
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username=username, email="", password=password)
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": Role.ADMIN})
    return team, password
