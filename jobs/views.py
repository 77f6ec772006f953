from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from jobs.models import Job
from nomadgpu.permissions import get_visible_or_404


@login_required
def job_detail(request, job_id: int):
    job = get_visible_or_404(Job.objects.select_related("team"), request.user, pk=job_id)
    return render(request, "jobs/job_detail.html", {"job": job, "events": job.events.all()})
