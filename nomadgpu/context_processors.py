from __future__ import annotations

from nomadgpu.permissions import can_see_billing, member_teams


def teams(request) -> dict:
    """The signed-in user's teams, the current one (session), for the team switcher, and
    whether the navigation offers the current team's finance pages (``can_see_billing``: the
    navigation shows what the user's role there can open, no more)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    mine = list(member_teams(user))
    slug = request.session.get("team")
    current = next((t for t in mine if t.slug == slug), mine[0] if mine else None)
    return {
        "my_teams": mine,
        "current_team": current,
        "sees_finance": current is not None and can_see_billing(user, current),
    }
