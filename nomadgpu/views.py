from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone

from jobs import portal, services
from jobs.views import current_team, rows_for
from nomadgpu.permissions import get_team_for_member_or_404, member_teams, role_in

DASHBOARD_JOBS = 10


@login_required
def dashboard(request):
    """The current team's spend this month and its latest jobs (live rows)."""
    now = timezone.now()
    team = current_team(request)
    rows = rows_for(team, now=now, limit=DASHBOARD_JOBS)
    context = {
        "teams": member_teams(request.user),
        "team": team,
        "rows": rows,
        "limit": DASHBOARD_JOBS,
        "any_live": any(r.live for r in rows),
        "live_count": team.jobs.exclude(state__in=services.TERMINAL).count() if team else 0,
        "month_spend": portal.team_month_spend(team, now=now) if team else 0.0,
    }
    return render(request, "nomadgpu/dashboard.html", context)


@login_required
def team_detail(request, slug: str):
    team = get_team_for_member_or_404(request.user, slug)
    request.session["team"] = team.slug
    rows = rows_for(team, now=timezone.now(), limit=50)
    context = {
        "team": team,
        "role": role_in(request.user, team),
        "rows": rows,
        "limit": 50,
        "any_live": any(r.live for r in rows),
        "members": team.memberships.select_related("user"),
    }
    return render(request, "nomadgpu/team_detail.html", context)
