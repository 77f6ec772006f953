"""The job page's buttons that are not cancel: resume a budget-paused job, ask the team's admins
to resume it, and the fire drill ("Simulate host loss").

Each is a real ``<form method="post">``; the drill asks first (htmx's ``hx-confirm``, or
without JavaScript a confirm page, as cancel does). Another team's job is 404; a team member
the action is not for gets 403 with a sentence naming who can.

- Resume: ``billing.resume.may_resume`` (admins; any member once the job fits again).
- Ask to resume: members and finance while a limit still holds the job; once per pause
  (``billing.resume.ask_to_resume``), so a second click notifies no one.
- Simulate host loss: team admins, on a job whose host is running; it calls
  ``jobs.drill.destroy_running_host`` and nothing else, so the drill is recorded (and marked
  as one) exactly as the CLI's and ``manage.py drill``'s are.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from billing import resume
from hosts.vast import VastError
from jobs import lifecycle
from jobs.drill import DrillError, destroy_running_host, step_words
from jobs.models import Job, JobState
from jobs.spending import BudgetExceeded
from nomadgpu.permissions import can_manage_team, get_visible_or_404
from nomadgpu.team_admins import admin_names, name_of


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    return get_visible_or_404(Job.objects.select_related("team"), request.user, pk=job_id)


def _to_job(request: HttpRequest, job: Job) -> HttpResponse:
    url = reverse("job-detail", args=[job.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@login_required
@require_POST
def job_resume(request: HttpRequest, job_id: int) -> HttpResponse:
    """Resume a budget-paused job: a team admin whenever the limits allow it, another member
    of the team once the job fits again (``billing.resume.may_resume``); 404 for outsiders."""
    job = _visible_job(request, job_id)
    now = timezone.now()
    if not resume.may_resume(request.user, job, now=now):
        raise PermissionDenied(
            f"Only a team admin ({admin_names(job.team)}) can raise the limit that holds this "
            "job; use Ask to resume on its page."
        )
    try:
        lifecycle.resume_job(job.pk, by=f"{request.user} (portal)", now=now)
    except BudgetExceeded as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.name} resumed; it continues from its checkpoint.")
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_POST
def job_ask_resume(request: HttpRequest, job_id: int) -> HttpResponse:
    """A member asks the team's admins to resume a budget-paused job, once per pause."""
    job = _visible_job(request, job_id)
    now = timezone.now()
    if job.state != JobState.PAUSED_BUDGET:
        messages.info(request, f"Nothing to ask: job {job.pk} is not paused by a limit.")
        return _to_job(request, job)
    if can_manage_team(request.user, job.team):
        messages.info(request, "You are an admin of the team: raise the limit, then Resume.")
        return _to_job(request, job)
    if resume.may_resume(request.user, job, now=now):
        messages.info(request, "The limits allow the rest of this job now: resume it yourself.")
        return _to_job(request, job)
    try:
        ask, made = resume.ask_to_resume(job, user=request.user, now=now)
    except resume.NotPaused as exc:  # resumed or cancelled since the page was read
        messages.info(request, f"Nothing to ask: {exc}.")
        return _to_job(request, job)
    admins = admin_names(job.team)
    if made:
        messages.success(request, f"Asked {admins} to resume {job.name}: {told(job)}.")
    else:
        who = "You" if ask.asked_by_id == request.user.pk else name_of(ask.asked_by)
        messages.info(
            request,
            f"{who} already asked {admins} to resume {job.name} during this pause: they were "
            "told once, and are not told again.",
        )
    return _to_job(request, job)


def told(job: Job) -> str:
    """How the admins hear of an ask: their pages, and the team's channels that take it."""
    channels = [c for c in job.team.channels.filter(enabled=True) if c.wants(resume.ASKED)]
    sent = f", and {len(channels)} notification channel{pluralize(len(channels))} got it"
    return "they see it on their portal pages" + (sent if channels else "")


@login_required
@require_http_methods(["GET", "POST"])
def job_drill(request: HttpRequest, job_id: int) -> HttpResponse:
    """The fire drill (team admins): destroy the job's running host, as a host dies. htmx asks
    in a dialog; without JS a confirm page asks first."""
    job = _visible_job(request, job_id)
    if not can_manage_team(request.user, job.team):
        raise PermissionDenied(
            f"Only a team admin ({admin_names(job.team)}) can destroy a job's host on purpose."
        )
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "jobs/job_drill.html", {"job": job})
    try:
        attempt = destroy_running_host(job, by=f"by {request.user.get_username()} (portal)")
    except DrillError as exc:
        messages.error(request, f"No drill: {exc}.")
    except VastError as exc:
        messages.error(request, f"No drill: the provider refused to destroy the instance: {exc}")
    else:
        messages.success(
            request,
            f"Fire drill: instance {attempt.instance_id} of attempt {attempt.number} destroyed"
            f"{step_words(attempt.step)}. Watch the timeline: the host is found lost, a "
            "replacement rented, and training resumes from the newest checkpoint.",
        )
    return _to_job(request, job)
