"""The member API (``/api/jobs/...``): what a team member may do with jobs from a script or
the ``nomadgpu`` CLI.

Auth: a personal API token (``Authorization: Bearer ngpt_...``, created at /account/tokens/),
or the browser session (so /api/docs can be tried while logged in; CSRF applies). Every query
is scoped to the caller's teams: another team's job is 404, never 403. Errors are JSON with
``detail``: a string, or for 422 a list of ``{loc, msg, type}`` naming the field.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer, django_auth

from billing.reconcile import job_cost
from billing.spend import job_spend
from hosts.vast import VastError
from jobs import job_status, lifecycle
from jobs.drill import DrillError, destroy_running_host
from jobs.models import Job
from jobs.spec import JOB_TEMPLATES, JobSpec, submit_spec, template_spec
from jobs.spending import BudgetExceeded
from nomadgpu import api_tokens
from nomadgpu.models import Team
from nomadgpu.permissions import (
    can_manage_team,
    get_team_for_member_or_404,
    get_visible_or_404,
    member_teams,
    visible_to,
)
from portal.figures import interruptible_blocker


class PersonalToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return api_tokens.authenticate_token(token, now=timezone.now())


router = Router(auth=[PersonalToken(), django_auth], tags=["jobs"])


# ---- schemas ----------------------------------------------------------------------------------


class SubmitIn(JobSpec):
    team: str | None = Field(
        None, max_length=50, description="team slug; needed when you belong to several teams"
    )


class HostOut(Schema):
    attempt: int
    attempt_state: str
    instance_id: int | None
    machine_id: int | None
    gpu_name: str
    dph: float
    phase: str
    last_heartbeat_at: datetime | None


class InterruptionOut(Schema):
    attempt: int
    cause: str
    detail: str
    last_heartbeat_at: datetime | None
    detected_at: datetime
    replacement_rented_at: datetime | None
    running_again_at: datetime | None
    step_reached: int | None
    resumed_step: int | None


class JobOut(Schema):
    id: int
    name: str
    team: str
    state: str
    step: int | None
    total_steps: int | None
    progress: float | None = Field(description="0..1; null while the total is unknown")
    eta_s: float | None = Field(description="seconds left at the latest speed, while running")
    spend_usd: float
    budget_usd: Decimal | None
    gpu_name: str
    interruptions: int
    created_at: datetime
    finished_at: datetime | None


class JobDetailOut(JobOut):
    image: str
    command: str
    failure_reason: str
    early_finish: str = Field(
        description='"ended at step 100 of 2,400" when the job succeeded short of its total'
        " steps (the command exited 0 early), else empty"
    )
    loss: float | None
    seconds_per_step: float | None
    spend: dict[str, float] = Field(description="gpu, storage, download, upload, total (USD)")
    cost_usd: float = Field(
        description="the job's cost as the job page and notifications show it: what Vast billed"
        " once every attempt is invoiced, else the recorded spend"
    )
    cost_basis: str = Field(description='"invoiced" or "estimated"')
    host: HostOut | None
    interruption_list: list[InterruptionOut]


class EventOut(Schema):
    id: int
    created_at: datetime
    kind: str
    message: str
    data: dict[str, Any]


class EventsOut(Schema):
    events: list[EventOut]
    cursor: int = Field(description="pass as ?after= to get only newer events")
    state: str


class LogLineOut(Schema):
    attempt: int
    text: str


class LogsOut(Schema):
    lines: list[LogLineOut]
    pending: str = Field(description="the last line, still being written (a progress bar)")
    cursor: str = Field(description="pass as ?cursor= to get only the lines after these")
    gap: bool = Field(description="lines were missed: the rolling tail moved past the cursor")
    state: str


class DrillOut(Schema):
    job_id: int
    attempt: int
    instance_id: int
    step: int | None
    destroyed_at: datetime


class JobFilters(Schema):
    team: str | None = Field(None, description="team slug")
    state: str | None = Field(None, description="one state or several, comma-separated")
    limit: int = Field(50, ge=1, le=200)


# ---- decisions --------------------------------------------------------------------------------


def choose_submit_team(user, slug: str | None) -> Team:
    """The team a submission goes to: the one named (404 unless the user is in it), else the
    user's only team; a member of several teams must say which (422 on ``team``)."""
    if slug:
        return get_team_for_member_or_404(user, slug)
    teams = list(member_teams(user).order_by("slug"))
    if len(teams) == 1:
        return teams[0]
    msg = (
        f"you belong to several teams ({', '.join(t.slug for t in teams)}): say which"
        if teams
        else "you belong to no team"
    )
    raise NinjaValidationError([{"loc": ["body", "payload", "team"], "msg": msg, "type": "team"}])


def _jobs_of(user) -> QuerySet[Job]:
    jobs = Job.objects.select_related("team").prefetch_related("attempts", "interruptions")
    return visible_to(jobs, user)


def _job_or_404(request: HttpRequest, job_id: int) -> Job:
    return get_visible_or_404(_jobs_of(request.auth), request.auth, pk=job_id)


def job_out(job: Job, *, now: datetime) -> dict[str, Any]:
    progress = job_status.job_progress(job)
    host = job_status.current_host(job)
    return {
        "id": job.pk,
        "name": job.name,
        "team": job.team.slug,
        "state": job.state,
        "step": progress.step,
        "total_steps": progress.total_steps,
        "progress": progress.fraction,
        "eta_s": progress.eta_s,
        "spend_usd": round(job_spend(job, now=now).total, 6),
        "budget_usd": job.budget_usd,
        "gpu_name": host.gpu_name if host else "",
        "interruptions": len(job.interruptions.all()),
        "created_at": job.created_at,
        "finished_at": job.finished_at,
    }


def job_detail_out(job: Job, *, now: datetime) -> dict[str, Any]:
    host = job_status.current_host(job)
    attempts = {a.pk: a.number for a in job.attempts.all()}
    cost = job_cost(job, now=now)
    return {
        **job_out(job, now=now),
        "image": job.image,
        "command": job.command,
        "failure_reason": job.failure_reason,
        "early_finish": job_status.early_finish_note(job),
        "loss": host.loss if host else None,
        "seconds_per_step": host.seconds_per_step if host else None,
        "spend": job_spend(job, now=now).as_dict(),
        "cost_usd": round(cost.amount, 6),
        "cost_basis": cost.basis,
        "host": None
        if host is None
        else {
            "attempt": host.number,
            "attempt_state": host.state,
            "instance_id": host.instance_id,
            "machine_id": host.machine_id,
            "gpu_name": host.gpu_name,
            "dph": host.dph_base,
            "phase": host.phase,
            "last_heartbeat_at": host.last_heartbeat_at,
        },
        "interruption_list": [
            {**_fields(i, InterruptionOut), "attempt": attempts.get(i.attempt_id, 0)}
            for i in sorted(job.interruptions.all(), key=lambda i: i.detected_at)
        ],
    }


def _fields(obj, schema: type[Schema]) -> dict[str, Any]:
    return {name: getattr(obj, name, None) for name in schema.model_fields}


# ---- endpoints --------------------------------------------------------------------------------


@router.post("/", response={201: JobDetailOut})
def submit(request: HttpRequest, payload: SubmitIn):
    """Submit a job (the TOML job file's fields as JSON, plus ``team``)."""
    team = choose_submit_team(request.auth, payload.team)
    spec = JobSpec.model_validate(payload.model_dump(exclude={"team"}))
    if (why := interruptible_blocker(spec, team=team)) is not None:
        raise HttpError(422, why)  # nothing was created or rented
    now = timezone.now()
    try:
        job = submit_spec(spec, team=team, created_by=request.auth, now=now)
    except BudgetExceeded as exc:  # nothing was created; the message carries the numbers
        raise HttpError(409, str(exc)) from exc
    return Status(201, job_detail_out(_job_or_404(request, job.pk), now=now))


@router.get("/templates/{name}", response=dict[str, Any])
def job_template(request: HttpRequest, name: str):
    """A ready-made job spec (``toy`` for the sandbox, ``qlora`` the field report's job), as
    this server resolves it: the toy's command points at this checkout's interpreter."""
    try:
        return template_spec(name)
    except KeyError:
        raise HttpError(
            404, f"no template {name!r}; there are: {', '.join(JOB_TEMPLATES)}"
        ) from None


@router.get("/", response=list[JobOut])
def list_jobs(request: HttpRequest, filters: Query[JobFilters]):
    """Your teams' jobs, newest first."""
    jobs = _jobs_of(request.auth)
    if filters.team:
        jobs = jobs.filter(team__slug=filters.team)
    if filters.state:
        jobs = jobs.filter(state__in=[s.strip() for s in filters.state.split(",")])
    now = timezone.now()
    return [job_out(job, now=now) for job in jobs.order_by("-created_at")[: filters.limit]]


@router.get("/{int:job_id}", response=JobDetailOut)
def show(request: HttpRequest, job_id: int):
    """State, progress, ETA, spend, host and interruptions of one job."""
    return job_detail_out(_job_or_404(request, job_id), now=timezone.now())


@router.post("/{int:job_id}/cancel", response=JobDetailOut)
def cancel(request: HttpRequest, job_id: int):
    """Stop the job for good: its host is released, its checkpoints are kept."""
    job = _job_or_404(request, job_id)
    try:
        lifecycle.cancel_job(job.pk, now=timezone.now(), by=f"by {request.auth} (API)")
    except lifecycle.IllegalTransition as exc:
        raise HttpError(409, f"job {job.pk} is {exc.current}; it cannot be cancelled") from exc
    return job_detail_out(_job_or_404(request, job_id), now=timezone.now())


@router.get("/{int:job_id}/events", response=EventsOut)
def events(
    request: HttpRequest,
    job_id: int,
    after: int = Query(0, ge=0, description="event id: only newer events"),
    limit: int = Query(200, ge=1, le=1000),
):
    """The job's timeline in order; follow it by passing the returned cursor as ``after``.

    Ordered by id. A transition's event is written while its update holds the job row, so
    transitions commit in id order; an event written without a transition (checkpoint
    ready, no offers) concurrently with another could commit out of id order, and a follower
    polling in between would skip it (it is still in the full timeline).
    """
    job = _job_or_404(request, job_id)
    rows = list(job.events.filter(pk__gt=after).order_by("pk")[:limit])
    cursor = rows[-1].pk if rows else after
    return {"events": rows, "cursor": cursor, "state": job.state}


@router.get("/{int:job_id}/logs", response=LogsOut)
def logs(request: HttpRequest, job_id: int, cursor: str | None = Query(None, max_length=80)):
    """The log tail of the current host; with ``cursor``, only the lines after it (across hosts)."""
    job = _job_or_404(request, job_id)
    try:
        chunk = job_status.follow_logs(list(job.attempts.all()), cursor)
    except ValueError as exc:
        raise HttpError(422, f"cursor {cursor!r} is not one this API returned") from exc
    return {
        "lines": [{"attempt": line.attempt, "text": line.text} for line in chunk.lines],
        "pending": chunk.pending,
        "cursor": chunk.cursor,
        "gap": chunk.gap,
        "state": job.state,
    }


@router.post("/{int:job_id}/drill", response={202: DrillOut})
def drill(request: HttpRequest, job_id: int):
    """Fire drill (team admins): destroy the job's current host now, the way a host dies; the
    supervisor should detect it, rent another and resume. Returns at once: follow the events."""
    job = _job_or_404(request, job_id)
    if not can_manage_team(request.auth, job.team):
        raise HttpError(403, "only an admin of the job's team may break its host on purpose")
    try:
        attempt = destroy_running_host(job, by=f"by {request.auth} (API)")
    except DrillError as exc:
        raise HttpError(409, str(exc)) from exc
    except VastError as exc:
        raise HttpError(502, f"the provider refused to destroy the instance: {exc}") from exc
    return Status(
        202,
        {
            "job_id": job.pk,
            "attempt": attempt.number,
            "instance_id": attempt.instance_id,
            "step": attempt.step,
            "destroyed_at": timezone.now(),
        },
    )
