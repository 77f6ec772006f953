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

from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
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
from portal.figures.blockers import gpu_count_blocker, interruptible_blocker
from portal.figures.job_rows import NEWEST_FIRST


class PersonalToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return api_tokens.authenticate_token(token, now=timezone.now())


router = Router(auth=[PersonalToken(), django_auth], tags=["jobs"])


# ---- schemas ----------------------------------------------------------------------------------


class SubmitIn(JobSpec):
    team: str | None = Field(
        None, max_length=50, description="team slug; needed when you belong to several teams"
    )


class GpuOut(Schema):
    """One GPU as the host's last heartbeat listed it; null where nvidia-smi had no value."""

    index: int | None
    pci_bus_id: str
    name: str
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    ecc_uncorrected: int | None = Field(
        description="uncorrected ECC errors since the driver loaded; null without ECC"
    )
    error: str | None = Field(description='"lost: ..." for a GPU that fell off the bus')


class HostOut(Schema):
    attempt: int
    attempt_state: str
    instance_id: int | None
    machine_id: int | None
    gpu_name: str
    dph: float
    phase: str
    last_heartbeat_at: datetime | None
    gpu_ok: bool | None = Field(description="the last heartbeat's GPU health; null before one")
    gpu_error: str = Field(description="why the GPUs are unhealthy (a GPU fault ends the host)")
    gpus: list[GpuOut] = Field(description="per GPU, from the last heartbeat")


class InterruptionOut(Schema):
    attempt: int
    cause: str
    detail: str
    drill: bool = Field(description="a fire drill: the host was destroyed on purpose")
    last_heartbeat_at: datetime | None
    detected_at: datetime
    replacement_rented_at: datetime | None
    lost_at: datetime = Field(
        description="the loss both figures count from: the last heartbeat, else the detection"
    )
    back_on_machine_at: datetime | None = Field(
        description="the replacement running (its training command started)"
    )
    back_on_machine_s: float | None = Field(
        description="seconds from the loss to back on a machine"
    )
    training_again_at: datetime | None = Field(description="the first training step after the loss")
    training_again_s: float | None = Field(description="seconds from the loss to training again")
    running_again_at: datetime | None = Field(description="the same as back_on_machine_at")
    step_reached: int | None
    resumed_step: int | None
    resume_note: str = Field(
        description='the two steps compared: "34 steps done again: the host had reached step '
        '91", "no work lost", or why a resume is past the last heartbeat\'s step; "" until known'
    )


class JobOut(Schema):
    id: int
    name: str
    team: str
    state: str
    step: int | None
    total_steps: int | None
    progress: float | None = Field(description="0..1; null while the total is unknown")
    eta_s: float | None = Field(description="seconds left at the latest speed, while running")
    cost_usd: float = Field(
        description="the job's cost as every surface shows it (billing.cost.job_cost): what"
        " NomadGPU recorded for each attempt until the imported invoice covers it, what Vast"
        " billed after; to the micro-dollar"
    )
    cost_basis: str = Field(
        description='"recorded", "invoiced" or "partly invoiced" (some attempts billed, the'
        " others recorded): which cost_usd is"
    )
    cost_text: str = Field(description='cost_usd as the portal writes it: "$0.0191"')
    cost_split_text: str = Field(
        description="a partly invoiced cost's two parts, adding up to cost_text: \"$0.0098"
        ' invoiced + $0.0043 recorded"; empty for any other'
    )
    spend_usd: float = Field(description="the same as cost_usd (kept for older scripts)")
    budget_usd: Decimal | None
    gpu_name: str
    interruptions: int
    created_at: datetime
    finished_at: datetime | None


class StartDeadlineOut(Schema):
    waiting_for: str = Field(description="the host's agent, or the next byte of its start-up")
    at: datetime
    in_s: float = Field(description="seconds until the deadline; negative once it passed")
    why: str = Field(
        description='what it allows for: "pull of 4.1 GB at 520 Mbit/s measured: 95 s + ..."'
    )
    text: str = Field(description="the job page's sentence: why, then due in (or overdue)")


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
    cost_breakdown: dict[str, float] = Field(
        description="cost_usd's parts: gpu, storage, download, upload and total (USD, to the"
        " micro-dollar; the parts add up to the total)"
    )
    cost_breakdown_text: dict[str, str] = Field(
        description='the parts as the portal writes them, adding up to cost_text: {"GPU":'
        ' "$0.0150", "storage": "$0.0011", ...}'
    )
    spend: dict[str, float] = Field(description="the same as cost_breakdown (older scripts)")
    host: HostOut | None
    interruption_list: list[InterruptionOut]
    stage: dict[str, Any] | None = Field(
        description="the staged model files (jobs.staging): state (staging, ready, failed),"
        " files_done/files_total, bytes_done/bytes_total, doing (what the staging task said"
        ' last: "resolving stage[0] hf ORG/NAME", a retry), text (as the job page writes it);'
        " null when the job stages nothing"
    )
    start_deadline: StartDeadlineOut | None = Field(
        None,
        description="the deadline the watchdog holds the live host to before training, from"
        " the image's bytes and the link (docs/renting-and-recovery.md, Detection); null while"
        " training or without a host",
    )


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
    step: int | None = Field(description="the step of the host's last heartbeat")
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


# ---- endpoints --------------------------------------------------------------------------------


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
