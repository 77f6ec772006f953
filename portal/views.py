"""The portal's pages: the dashboard, a team's page, and the job pages (list, submit with
offers and cost before submit, detail, cancel, checkpoint download; resume, ask to resume and
the drill are ``portal.job_actions``). Every page works without JavaScript; with htmx the live
parts are fragments of the same templates (``page.html#fragment``), polled every few seconds
while the job can change.
"""

from __future__ import annotations

import base64
from functools import partial

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agent.ckptcrypto import DecryptingReader
from billing import resume
from jobs import job_status, lifecycle, rent_decision
from jobs.checkpoints import requests
from jobs.code import job_secrets, packs
from jobs.job_templates import JOB_TEMPLATES, template_spec
from jobs.models import AttemptState, Checkpoint, Job, JobState
from jobs.spec import MissingSecret, submit_spec
from jobs.spending import BudgetExceeded
from jobs.staging import stage
from nomadgpu import humanize, team_secrets
from nomadgpu.permissions import (
    can_manage_team,
    can_see_billing,
    get_team_for_member_or_404,
    get_visible_or_404,
    member_teams,
    role_in,
)
from nomadgpu.services import set_password_path
from nomadgpu.storage import StorageError, object_store
from portal import figures as portal
from portal.figures.charts import latest_loss
from portal.figures.job_rows import NEWEST_FIRST, team_job_counts
from portal.forms import JobForm, spec_to_initial, workdir_field
from portal.team_secrets import TeamSecretForm, secrets_context

LIST_LIMIT = 200
DASHBOARD_JOBS = 10
STREAM_CHUNK = 1024 * 1024


def current_team(request: HttpRequest):
    """The team chosen in the switcher (session), else the user's first team, else None."""
    teams = list(member_teams(request.user))
    slug = request.GET.get("team") or request.session.get("team")
    team = next((t for t in teams if t.slug == slug), teams[0] if teams else None)
    if team is not None and request.session.get("team") != team.slug:
        request.session["team"] = team.slug
    return team


def rows_for(team, *, now, limit: int = LIST_LIMIT) -> list[portal.JobRow]:
    """TEAM's newest LIMIT jobs as rows, newest first (the id breaks a tie of one moment)."""
    if team is None:
        return []
    jobs = portal.with_portal_data(Job.objects.filter(team=team)).order_by(*NEWEST_FIRST)
    return [portal.job_row(job, now=now) for job in jobs[:limit]]


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
        "counts": team_job_counts(team) if team else None,
        "month_spend": portal.team_month_spend(team, now=now) if team else None,
    }
    return render(request, "nomadgpu/dashboard.html", context)


@login_required
def team_detail(request, slug: str):
    """The team's jobs and members; its admins also see each new member's set-password link
    and the team's secrets (names only)."""
    team = get_team_for_member_or_404(request.user, slug)
    request.session["team"] = team.slug
    return render_team_page(request, team)


def render_team_page(
    request: HttpRequest, team, *, secret_form: TeamSecretForm | None = None, status: int = 200
) -> HttpResponse:
    rows = rows_for(team, now=timezone.now(), limit=50)
    context = {
        "team": team,
        "role": role_in(request.user, team),
        "rows": rows,
        "limit": 50,
        "any_live": any(r.live for r in rows),
        "members": member_rows(request, team),
        **secrets_context(request, team, secret_form),
    }
    return render(request, "nomadgpu/team_detail.html", context, status=status)


def _team_managed_by(request: HttpRequest, slug: str):
    team = get_team_for_member_or_404(request.user, slug)
    if not can_manage_team(request.user, team):
        raise PermissionDenied("Only a team admin can change the team's secrets.")
    return team


def _to_team_secrets(team) -> HttpResponse:
    return redirect(reverse("team-detail", args=[team.slug]) + "#secrets")


@login_required
@require_POST
def team_secret_set(request: HttpRequest, slug: str) -> HttpResponse:
    """Add or replace a team secret (team admins); an invalid form shows the Team page again,
    its errors under the fields and the value fields empty."""
    team = _team_managed_by(request, slug)
    form = TeamSecretForm(request.POST)
    if form.is_valid():
        name = form.cleaned_data["name"]
        try:
            team_secrets.set_secret(team=team, name=name, value=form.cleaned_data["value"])
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Secret {name} saved. Its value is never shown again.")
            if note := team_secrets.mask_note(form.cleaned_data["value"]):
                messages.warning(request, f"Secret {name}: {note}.")
            return _to_team_secrets(team)
    return render_team_page(request, team, secret_form=form, status=400)


@login_required
@require_POST
def team_secret_delete(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """Delete a team secret by name (team admins): a job naming it no longer gets it."""
    team = _team_managed_by(request, slug)
    if team_secrets.delete_secret(team=team, name=name):
        messages.success(request, f"Secret {name} deleted.")
    else:
        messages.info(request, f"The team has no secret named {name}.")
    return _to_team_secrets(team)


def member_rows(request: HttpRequest, team) -> list[tuple]:
    """(membership, set-password link or "") per member; links only for the team's admins."""
    manages = can_manage_team(request.user, team)
    out = []
    for m in team.memberships.select_related("user"):
        found = set_password_path(m.user) if manages else None
        out.append((m, request.build_absolute_uri(found) if found else ""))
    return out


def _positive_int(text: str | None, default: int) -> int:
    try:
        return max(int(text), 1) if text else default
    except ValueError:
        return default


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """The current team's jobs; with htmx only the rows (polled while any job is live)."""
    team = current_team(request)
    limit = min(_positive_int(request.GET.get("limit"), LIST_LIMIT), LIST_LIMIT)
    rows = rows_for(team, now=timezone.now(), limit=limit)
    context = {"team": team, "rows": rows, "limit": limit, "any_live": any(r.live for r in rows)}
    template = "jobs/job_list.html#rows" if request.htmx else "jobs/job_list.html"
    return render(request, template, context)


# --- Submit -----------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    """The submission form: a template pre-fills it, "Preview" shows offers and the estimated
    cost (an htmx fragment, or the whole page without JS), "Submit" queues the job."""
    teams = list(member_teams(request.user))
    if not teams:
        raise Http404("You are not in a team.")
    team = current_team(request)
    preview, figures = None, []
    if request.method == "POST":
        team = get_team_for_member_or_404(request.user, request.POST.get("team", team.slug))
        form = JobForm(request.POST, request.FILES, secret_names=team_secrets.names_of(team))
        if form.is_valid():
            if request.POST.get("action") == "preview":
                preview = portal.preview_offers(form.cleaned_data["spec"], team=team)
                figures = portal.preview_figures(form.cleaned_data["spec"], team=team)
            else:
                job = _submit(request, form, team)
                if job is not None:
                    return redirect("job-detail", job.id)
    else:
        name = request.GET.get("template", "")
        initial = spec_to_initial(template_spec(name)) if name in JOB_TEMPLATES else {}
        form = JobForm(initial=initial, secret_names=team_secrets.names_of(team))
    templates = [(key, label) for key, (label, _) in JOB_TEMPLATES.items()]
    context = {
        "form": form,
        "preview": preview,
        "estimate_figures": figures,
        "teams": teams,
        "team": team,
        "templates": templates,
    }
    # htmx swaps the form alone (its inline errors and the preview); without JS, the page.
    template = "jobs/job_new.html#form" if request.htmx else "jobs/job_new.html"
    return render(request, template, context)


def _submit(request: HttpRequest, form: JobForm, team) -> Job | None:
    if (why := portal.gpu_count_blocker(form.cleaned_data["spec"], team=team)) is not None:
        form.add_error("num_gpus", why)
        return None
    if (why := portal.interruptible_blocker(form.cleaned_data["spec"], team=team)) is not None:
        form.add_error("rental", why)
        return None
    try:
        _store_code(form, team)
        job = submit_spec(
            form.cleaned_data["spec"], team=team, created_by=request.user, now=timezone.now()
        )
    except BudgetExceeded as exc:
        form.add_error(None, str(exc))
        return None
    except MissingSecret as exc:  # nothing was created
        form.add_error(exc.field, str(exc))
        return None
    except packs.WorkdirRefused as exc:
        form.add_error(workdir_field(exc.about), str(exc))
        return None
    messages.success(request, f"Job {job.name} submitted.")
    return job


def _store_code(form: JobForm, team) -> None:
    """Store the form's code archive as the team's pack (encrypted when the job encrypts its
    checkpoints), so the submit finds it ready; a pack already stored is not written again."""
    pack = form.code_pack
    if pack is None:
        return
    encrypted = form.cleaned_data["spec"].encrypt_checkpoints
    try:
        packs.store_pack(
            team=team, sha256=pack.sha256, size=pack.size, source=pack.file, encrypted=encrypted
        )
    except StorageError as exc:
        raise packs.WorkdirRefused(f"the code could not be stored: {exc}", about="archive") from exc


# --- Detail -----------------------------------------------------------------------------------


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    return get_visible_or_404(Job.objects.select_related("team"), request.user, pk=job_id)


def detail_context(request: HttpRequest, job: Job) -> dict:
    now = timezone.now()
    job = portal.with_portal_data(Job.objects.filter(pk=job.pk)).get()
    row = portal.job_row(job, now=now)
    checkpoints = job.checkpoints.ready().select_related("attempt")
    spend_points, spend_unit = portal.spend_series(job, now=now, cost=row.cost)
    decision = rent_decision.page_decision(job.attempts.all())
    return {
        "job": job,
        "row": row,
        "timeline": portal.timeline(job),
        # Called by the template only where it is shown (not in the polled live fragment).
        "estimate_figures": partial(portal.estimate_figures, job),
        "checkpoints": checkpoints.newest_first(),
        "auto_checkpoint": requests.page_summary(job, now=now),
        "staging": stage.progress(job),
        "start_deadline": job_status.start_deadline(job, now=now),
        "attempts": list(job.attempts.all()),
        "gpu_rows": portal.gpu_rows(row.attempt),
        # Masked again here: the agent masks the job's secret values before they leave it.
        "log_tail": job_secrets.mask_for(job, row.attempt.log_tail) if row.attempt else "",
        "decision": decision,
        "offer_rows": portal.offer_rows(decision),
        "loss_chart": portal.line_chart(portal.loss_series(job), y_format=humanize.loss),
        "latest_loss": latest_loss(job),
        "spend_chart": portal.line_chart(spend_points, y_format=portal.spend_text),
        "spend_unit": spend_unit,
        "can_cancel": not lifecycle.is_terminal(job.state),
        # What this reader can do about a budget pause (billing.resume): resume, or ask.
        "paused": resume.paused_help(job, user=request.user, now=now)
        if job.state == JobState.PAUSED_BUDGET
        else None,
        "can_drill": can_manage_team(request.user, job.team)
        and job.state == JobState.RUNNING
        and row.attempt is not None
        and row.attempt.state == AttemptState.RUNNING
        and row.attempt.instance_id is not None,
        "show_billing": can_see_billing(request.user, job.team),
    }


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page; with htmx only its live region (polled until the job is finished)."""
    job = _visible_job(request, job_id)
    template = "jobs/job_detail.html#live" if request.htmx else "jobs/job_detail.html"
    return render(request, template, detail_context(request, job))


@login_required
@require_http_methods(["GET", "POST"])
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel after a confirmation: htmx asks in a dialog, without JS a confirm page asks."""
    job = _visible_job(request, job_id)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "jobs/job_cancel.html", {"job": job})
    try:
        lifecycle.cancel_job(job.pk, now=timezone.now(), by=f"by {request.user.get_username()}")
    except lifecycle.IllegalTransition:
        messages.info(request, f"Job {job.name} had already finished.")
    else:
        messages.success(request, f"Job {job.name} cancelled; its checkpoints are kept.")
    url = reverse("job-detail", args=[job.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@login_required
def checkpoint_download(request: HttpRequest, job_id: int, checkpoint_id: int) -> HttpResponse:
    """Stream a ready checkpoint's tar from storage, decrypting an encrypted one on the way."""
    job = _visible_job(request, job_id)
    checkpoint = job.checkpoints.ready().filter(pk=checkpoint_id).first()
    if checkpoint is None:
        raise Http404("No such ready checkpoint.")
    try:
        source = object_store(job.team).open_read(checkpoint.key)
    except StorageError as exc:
        raise Http404("The checkpoint object is missing from storage.") from exc
    response = StreamingHttpResponse(
        _stream(source, checkpoint, job), content_type="application/x-tar"
    )
    name = f"{job.name}-step{checkpoint.step}.tar"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    if not checkpoint.encrypted:
        response["Content-Length"] = str(checkpoint.size)
    return response


def _stream(source, checkpoint: Checkpoint, job: Job):
    """Chunks of the object; decrypted ones for an ngck1 checkpoint (a chunk at a time)."""
    try:
        reader = source
        if checkpoint.encrypted:
            reader = DecryptingReader(source, base64.b64decode(job.data_key))
        while chunk := reader.read(STREAM_CHUNK):
            yield chunk
    finally:
        source.close()
