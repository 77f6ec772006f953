"""The member API (``/api/jobs/...``): what a team member may do with jobs from a script or
the ``nomadgpu`` CLI.

Auth: a personal API token (``Authorization: Bearer ngpt_...``, created at /account/tokens/),
or the browser session (so /api/docs can be tried while logged in; CSRF applies). Every query
is scoped to the caller's teams: another team's job is 404, never 403. Errors are JSON with
``detail``: a string, or for 422 a list of ``{loc, msg, type}`` naming the field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer, django_auth

from billing.cost import JobCost, charges_prefetch, job_cost
from hosts.vast import VastError
from jobs import anatomy, job_status, lifecycle
from jobs.code import job_secrets, packs
from jobs.drill import DrillError, destroy_running_host
from jobs.job_templates import JOB_TEMPLATES, template_spec
from jobs.models import Attempt, Interruption, Job
from jobs.recovery_times import recovery_times
from jobs.spec import JobSpec, MissingSecret, submit_spec
from jobs.spending import BudgetExceeded
from jobs.staging import stage
from nomadgpu import api_tokens
from nomadgpu.models import Team
from nomadgpu.permissions import (
    can_manage_team,
    get_team_for_member_or_404,
    get_visible_or_404,
    member_teams,
    visible_to,
)
from portal.api_schemas import (
    DrillOut,
    EventsOut,
    GpuOut,
    InterruptionOut,
    JobDetailOut,
    JobFilters,
    JobOut,
    LogsOut,
    SubmitIn,
)
from portal.figures.blockers import gpu_count_blocker, interruptible_blocker
from portal.figures.job_rows import NEWEST_FIRST


class PersonalToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return api_tokens.authenticate_token(token, now=timezone.now())


router = Router(auth=[PersonalToken(), django_auth], tags=["jobs"])


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


def workdir_error(exc: packs.WorkdirRefused) -> NinjaValidationError:
    """A refused workdir as a 422 naming its field (``workdir.ref``, ``workdir.sha256``)."""
    loc = ["body", "payload", "workdir", *([exc.about] if exc.about else [])]
    return NinjaValidationError([{"loc": loc, "msg": str(exc), "type": "workdir"}])


def _jobs_of(user) -> QuerySet[Job]:
    attempts = Prefetch("attempts", queryset=Attempt.objects.prefetch_related(charges_prefetch()))
    jobs = Job.objects.select_related("team").prefetch_related(attempts, "interruptions")
    return visible_to(jobs, user)


def _job_or_404(request: HttpRequest, job_id: int) -> Job:
    return get_visible_or_404(_jobs_of(request.auth), request.auth, pk=job_id)


def cost_out(cost: JobCost) -> dict[str, Any]:
    """The job's one cost (``billing.cost.job_cost``) as the API's fields."""
    return {
        "cost_usd": float(cost.total),
        "cost_basis": cost.basis,
        "cost_text": cost.text,
        "cost_split_text": cost.split,
        "spend_usd": float(cost.total),
    }


def job_out(job: Job, *, now: datetime, cost: JobCost | None = None) -> dict[str, Any]:
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
        **cost_out(cost or job_cost(job, now=now)),
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
    breakdown = cost.as_dict()
    return {
        **job_out(job, now=now, cost=cost),
        "image": job.image,
        "command": job.command,
        "failure_reason": job.failure_reason,
        "stage": stage.progress(job),
        "early_finish": job_status.early_finish_note(job),
        "start_deadline": _start_deadline_out(job, now=now),
        "loss": host.loss if host else None,
        "seconds_per_step": host.seconds_per_step if host else None,
        "cost_breakdown": breakdown,
        "cost_breakdown_text": dict(cost.breakdown()),
        "spend": breakdown,
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
            "gpu_ok": host.gpu_ok,
            "gpu_error": host.gpu_error,
            "gpus": [_gpu_out(g) for g in host.gpus if isinstance(g, dict)]
            if isinstance(host.gpus, list)
            else [],
        },
        "interruption_list": [
            {
                **_fields(i, InterruptionOut),
                **_recovery_fields(i),
                "attempt": attempts.get(i.attempt_id, 0),
                "resume_note": anatomy.resume_note(i.step_reached, i.resumed_step),
            }
            for i in sorted(job.interruptions.all(), key=lambda i: i.detected_at)
        ],
    }


def _start_deadline_out(job: Job, *, now: datetime) -> dict[str, Any] | None:
    due = job_status.start_deadline(job, now=now)
    if due is None:
        return None
    return {"waiting_for": due.waiting_for, "at": due.at, "in_s": due.in_s, "why": due.why,
            "text": due.text}  # fmt: skip


def _recovery_fields(row: Interruption) -> dict[str, Any]:
    """ROW's two figures as ``jobs.recovery_times`` defines them (the job page's, the CLI's)."""
    times = recovery_times(row)
    return {
        "lost_at": times.lost_at,
        "back_on_machine_at": times.back_on_machine_at,
        "back_on_machine_s": times.back_on_machine_s,
        "training_again_at": times.training_again_at,
        "training_again_s": times.training_again_s,
    }


def _gpu_out(gpu: dict[str, Any]) -> dict[str, Any]:
    """A stored GPU row with every field GpuOut names (null where an older agent sent none)."""
    return {name: gpu.get(name) for name in GpuOut.model_fields} | {
        "pci_bus_id": gpu.get("pci_bus_id") or "",
        "name": gpu.get("name") or "",
    }


def _fields(obj, schema: type[Schema]) -> dict[str, Any]:
    return {name: getattr(obj, name, None) for name in schema.model_fields}


@router.post("/", response={201: JobDetailOut})
def submit(request: HttpRequest, payload: SubmitIn):
    """Submit a job (the TOML job file's fields as JSON, plus ``team``)."""
    team = choose_submit_team(request.auth, payload.team)
    spec = JobSpec.model_validate(payload.model_dump(exclude={"team"}))
    if (why := gpu_count_blocker(spec, team=team)) is not None:
        loc = ["body", "payload", "requirements", "num_gpus"]  # the field, like a bad value
        raise NinjaValidationError([{"loc": loc, "msg": why, "type": "num_gpus"}])
    if (why := interruptible_blocker(spec, team=team)) is not None:
        raise HttpError(422, why)  # nothing was created or rented
    now = timezone.now()
    try:
        job = submit_spec(spec, team=team, created_by=request.auth, now=now)
    except BudgetExceeded as exc:  # nothing was created; the message carries the numbers
        raise HttpError(409, str(exc)) from exc
    except MissingSecret as exc:  # nothing was created: a 422 on the field, like a bad value
        loc = ["body", "payload", exc.field]
        raise NinjaValidationError([{"loc": loc, "msg": str(exc), "type": "secret"}]) from exc
    except packs.WorkdirRefused as exc:  # nothing was created: the code cannot be used
        raise workdir_error(exc) from exc
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
    return [job_out(job, now=now) for job in jobs.order_by(*NEWEST_FIRST)[: filters.limit]]


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
    mask = job_secrets.masker(job)  # the agent masked them already: defence in depth
    return {
        "lines": [{"attempt": line.attempt, "text": mask(line.text)} for line in chunk.lines],
        "pending": mask(chunk.pending),
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
