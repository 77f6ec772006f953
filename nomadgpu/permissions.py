"""Who may see and do what. Every portal view, API endpoint and admin page goes through these.

A member sees only their teams' objects; finance (and admins) see billing; a team admin
manages the team. Objects outside the user's teams are reported as missing (404), never as
forbidden, so a URL does not reveal that another team's object exists.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import Model, QuerySet
from django.http import Http404

from nomadgpu.models import Membership, Role, Team

BILLING_ROLES = (Role.FINANCE, Role.ADMIN)


def member_teams(user) -> QuerySet[Team]:
    """The teams USER belongs to, in any role."""
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def teams_with_role(user, *roles: str) -> QuerySet[Team]:
    """The teams where USER holds one of ROLES."""
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user, memberships__role__in=roles)


def is_any_team_admin(user) -> bool:
    """USER holds the admin role in at least one team."""
    return teams_with_role(user, Role.ADMIN).exists()


def users_visible_to(user) -> QuerySet:
    """The users USER may pick in the admin: everyone for a superuser, else the members of
    the teams USER administers (a team admin never sees another team's people)."""
    users = get_user_model().objects.order_by("username")
    if user.is_superuser:
        return users
    return users.filter(memberships__team__in=teams_with_role(user, Role.ADMIN)).distinct()


def role_in(user, team: Team) -> str | None:
    """USER's role in TEAM, or None for an outsider."""
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def can_see_billing(user, team: Team) -> bool:
    return role_in(user, team) in BILLING_ROLES


def can_manage_team(user, team: Team) -> bool:
    return user.is_superuser or role_in(user, team) == Role.ADMIN


def visible_to(queryset: QuerySet, user, *, team_path: str = "team") -> QuerySet:
    """QUERYSET narrowed to the objects of USER's teams (TEAM_PATH leads from model to Team)."""
    if not user.is_authenticated:
        return queryset.none()
    return queryset.filter(**{f"{team_path}__memberships__user": user}).distinct()


def get_visible_or_404(queryset: QuerySet, user, *, team_path: str = "team", **lookup) -> Model:
    """The one object matching LOOKUP among USER's teams' objects, else 404."""
    try:
        return visible_to(queryset, user, team_path=team_path).get(**lookup)
    except queryset.model.DoesNotExist as exc:
        raise Http404(f"No {queryset.model._meta.verbose_name} matches the given query.") from exc


def get_team_for_member_or_404(user, slug: str) -> Team:
    """The team with SLUG if USER belongs to it, else 404."""
    team = member_teams(user).filter(slug=slug).first()
    if team is None:
        raise Http404("No team matches the given query.")
    return team
