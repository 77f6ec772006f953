from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.services import BudgetExceeded, resume_job
from jobs.models import Job
from nomadgpu.permissions import can_manage_team, get_visible_or_404


@login_required
@require_POST
def job_resume(request, job_id: int):
    """Resume a budget-paused job (team admins; 404 for outsiders, 403 for other members)."""
    job = get_visible_or_404(Job.objects.select_related("team"), request.user, pk=job_id)
    if not can_manage_team(request.user, job.team):
        raise PermissionDenied("Only a team admin can resume a job.")
    try:
        resume_job(job, by=f"{request.user} (portal)", now=timezone.now())
    except BudgetExceeded as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.name} resumed; it continues from its checkpoint.")
    return redirect("job-detail", job_id=job.pk)
