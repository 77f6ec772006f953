from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from jobs.models import Job
from nomadgpu.permissions import get_team_for_member_or_404, member_teams, role_in, visible_to


@login_required
def dashboard(request):
    """The user's teams and their latest jobs."""
    jobs = visible_to(Job.objects.select_related("team"), request.user)[:50]
    return render(
        request, "nomadgpu/dashboard.html", {"jobs": jobs, "teams": member_teams(request.user)}
    )


@login_required
def team_detail(request, slug: str):
    team = get_team_for_member_or_404(request.user, slug)
    request.session["team"] = team.slug
    context = {
        "team": team,
        "role": role_in(request.user, team),
        "jobs": team.jobs.all()[:50],
        "members": team.memberships.select_related("user"),
    }
    return render(request, "nomadgpu/team_detail.html", context)
