"""Who can act for a team: its admins, by name. A refusal a member meets (a spending limit, the
team's secrets) names the people who can do what the member cannot, instead of "an admin"."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from nomadgpu.models import Role, Team

NO_ADMIN = "no one yet: the team has no admin (the server's operator, a superuser, can add one)"


def admins_of(team: Team) -> list:
    """TEAM's admins (users), by username."""
    users = get_user_model().objects.filter(
        memberships__team=team, memberships__role=Role.ADMIN, is_active=True
    )
    return list(users.order_by("username").distinct())


def name_of(user) -> str:
    """How a person is named to their team: the full name with the username, else the username."""
    full = user.get_full_name().strip()
    username = user.get_username()
    return f"{full} ({username})" if full and full != username else username


def or_list(names: list[str]) -> str:
    """ "alice", "alice or carol", "alice, carol or dan"."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def admin_names(team: Team) -> str:
    """TEAM's admins as one phrase ("alice or carol"), or ``NO_ADMIN``."""
    return or_list([name_of(u) for u in admins_of(team)]) or NO_ADMIN
