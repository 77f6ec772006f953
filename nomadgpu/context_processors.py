from __future__ import annotations

from nomadgpu.permissions import member_teams


def teams(request) -> dict:
    """The signed-in user's teams and the current one (session), for the team switcher."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    mine = list(member_teams(user))
    slug = request.session.get("team")
    current = next((t for t in mine if t.slug == slug), mine[0] if mine else None)
    return {"my_teams": mine, "current_team": current}
