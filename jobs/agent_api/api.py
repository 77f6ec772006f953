"""The agent API (``/api/agent/...``): what an agent in a rented container may say and ask.

Bearer token per attempt (``nomadgpu.tokens``). Unknown token → 401; token of an ended attempt →
410 telling the agent to stop (fencing). Bodies are validated with limits; every error is a JSON
body with ``detail``. The wire contract is ``agent/PROTOCOL.md``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Literal

from django.http import FileResponse, HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Router, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.security import HttpBearer
from pydantic import BaseModel

from jobs import bootstrap
from jobs.agent_api import auth
from jobs.agent_api.exit import record_exit
from jobs.agent_api.heartbeat import MAX_GPUS, record_heartbeat
from jobs.agent_api.heartbeat_store import Heartbeat
from jobs.agent_api.phases import PHASE_AGE_LIMIT_S, record_phases
from jobs.agent_api.register import fail_without_code, register_agent
from jobs.checkpoints import records
from jobs.code import packs
from jobs.models import Attempt, Checkpoint


@contextmanager
def token_answers():
    """What the agent is told when its token is refused: 401 for an unknown token, 503 (back
    off and retry) while the rent is not recorded yet, 410 (stop: fencing) once it has ended."""
    try:
        yield
    except auth.TokenUnknown as exc:
        raise AuthenticationError from exc
    except auth.AttemptNotRentedYet as exc:
        # 503 is "supervisor unavailable" to the agent: it backs off and tries again.
        raise HttpError(503, "this attempt is not recorded as rented yet; retry soon") from exc
    except auth.TokenDead as exc:
        raise HttpError(410, f"this attempt has ended ({exc}); stop training and exit") from exc


class AgentToken(HttpBearer):
    """``request.auth`` is the live attempt holding the token, on every endpoint. The heartbeat
    (FOR_HEARTBEAT) loads only the fields it reads: it comes every interval from every host."""

    def __init__(self, *, for_heartbeat: bool = False, racer: str | None = None) -> None:
        super().__init__()
        self.for_heartbeat, self.racer = for_heartbeat, racer

    def authenticate(self, request: HttpRequest, token: str) -> Attempt:
        with token_answers():
            return auth.authenticate_agent(
                token, for_heartbeat=self.for_heartbeat, racer=self.racer
            )


router = Router(auth=AgentToken(), tags=["agent"])


class PhasesIn(BaseModel):
    """Phase boundaries the agent saw, each as seconds before this call (so the host's clock
    does not matter). Unknown names are ignored; an older agent sends none. A value that is
    not a plausible age is dropped, never refused: a 422 would reject the heartbeat it rides on.
    """

    container_started: float | None = None
    deps_ready: float | None = None
    workdir_ready: float | None = None  # the job's code fetched and unpacked (or cloned)
    setup_done: float | None = None  # the job's setup finished
    stage_done: float | None = None  # the staged model files laid out (jobs.staging)
    restore_downloaded: float | None = None
    restore_unpacked: float | None = None
    command_started: float | None = None
    first_step: float | None = None

    def ages(self) -> dict[str, float]:
        return {
            name: age
            for name, age in self.model_dump().items()
            if age is not None and 0 <= age <= PHASE_AGE_LIMIT_S
        }


class RegisterIn(Schema):
    agent_version: str = Field(..., max_length=40)
    hostname: str = Field("", max_length=255)
    python: str = Field("", max_length=40)
    phases: PhasesIn | None = None


# The heartbeat's bodies are plain pydantic models, not ninja Schemas: a Schema's root validator
# (it reads Django objects for output) ran once per nested object and cost more CPU than the
# validation itself, on the API's busiest endpoint.
class GpuIn(BaseModel):
    """One GPU as nvidia-smi listed it (``agent.gpu``); a value it had none for is null."""

    index: int | None = Field(None, ge=0, le=63)
    pci_bus_id: str = Field("", max_length=32)
    name: str = Field("", max_length=100)
    utilization_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    memory_used_mib: float | None = Field(None, ge=0, le=10**7, allow_inf_nan=False)
    memory_total_mib: float | None = Field(None, ge=0, le=10**7, allow_inf_nan=False)
    temperature_c: float | None = Field(None, ge=-100, le=200, allow_inf_nan=False)
    ecc_uncorrected: int | None = Field(None, ge=0, le=2**63 - 1)
    error: str | None = Field(None, max_length=300)


class GpuHealthIn(BaseModel):
    ok: bool
    error: str | None = Field(None, max_length=2000)
    # Per GPU; an older agent sends none. More than a host can have is refused (422).
    gpus: list[GpuIn] = Field(default_factory=list, max_length=MAX_GPUS)


class PhaseBytesIn(BaseModel):
    """One early phase's bytes: done so far (this agent process), the total where known, and
    whether the phase ended."""

    bytes_done: int = Field(0, ge=0, le=2**63 - 1)
    bytes_total: int | None = Field(None, ge=0, le=2**63 - 1)
    done: bool = False


class PhaseProgressIn(BaseModel):
    """The early phases an agent has begun (PROTOCOL.md, heartbeat ``phase_progress``); unknown
    names are ignored, and an older agent sends none."""

    code: PhaseBytesIn | None = None
    stage: PhaseBytesIn | None = None
    setup: PhaseBytesIn | None = None
    restore: PhaseBytesIn | None = None

    def reported(self) -> dict[str, dict]:
        return {name: p for name, p in self.model_dump().items() if p is not None}


class HeartbeatIn(BaseModel):
    seq: int = Field(..., ge=0)
    phase: Literal["starting", "restoring", "running", "uploading", "exiting"] = "running"
    step: int | None = Field(None, ge=0, le=10**9)
    total_steps: int | None = Field(None, ge=0, le=10**9)
    loss: float | None = Field(None, allow_inf_nan=False)
    seconds_per_step: float | None = Field(None, ge=0, le=10**6, allow_inf_nan=False)
    gpu: GpuHealthIn
    bytes_down: int = Field(0, ge=0)
    bytes_up: int = Field(0, ge=0)
    # The container's traffic since the agent started; an older agent sends neither.
    net_rx_bytes: int | None = Field(None, ge=0, le=2**63 - 1)
    net_tx_bytes: int | None = Field(None, ge=0, le=2**63 - 1)
    log_tail: str = Field("", max_length=16 * 1024)
    # Sent until a heartbeat carrying them is answered; then no more.
    phases: PhasesIn | None = None
    # Before the command: the early phases' bytes (the start deadline's stall rule).
    phase_progress: PhaseProgressIn | None = None


class HeartbeatOut(BaseModel):
    command: Literal["continue", "checkpoint_now", "stop"]
    heartbeat_interval_s: float


class CheckpointIn(Schema):
    step: int = Field(..., ge=0, le=10**9)
    size: int = Field(..., gt=0, le=5 * 1024**4)
    encrypted: bool = False


class PartIn(Schema):
    part_number: int = Field(..., ge=1, le=records.MAX_PARTS)
    etag: str = Field(..., max_length=200)


class CompleteIn(Schema):
    size: int = Field(..., gt=0)
    sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$")
    parts: list[PartIn] = Field(default_factory=list, max_length=records.MAX_PARTS)


class ExitIn(Schema):
    exit_code: int | None = Field(None, ge=-255, le=255)
    signal: int | None = Field(None, ge=0, le=128)
    # setup_failed: the job's setup (or fetching its code) failed; the command never started.
    reason: Literal["finished", "failed", "stopped", "killed", "agent_error", "setup_failed"]
    error: str | None = Field(None, max_length=2000)
    log_tail: str = Field("", max_length=16 * 1024)


# A hedged rent's racer wins its race by registering first (``auth.RACER_WINS``).
@router.post("/register", auth=AgentToken(racer=auth.RACER_WINS))
def register(request: HttpRequest, payload: RegisterIn) -> dict:
    phases = payload.phases.ages() if payload.phases else {}
    now = timezone.now()
    try:
        return register_agent(request.auth, now=now, phases=phases)
    except packs.PackUnavailable as exc:
        # No host can run it: the job fails, its machine is released, and the agent stops.
        fail_without_code(request.auth, why=str(exc), now=now)
        raise HttpError(410, f"{exc}; this attempt has ended: stop") from exc


@router.post("/heartbeat", response=HeartbeatOut, auth=AgentToken(for_heartbeat=True))
def heartbeat(request: HttpRequest, payload: HeartbeatIn) -> dict:
    gpu, now = payload.gpu, timezone.now()
    beat = Heartbeat(
        **payload.model_dump(exclude={"gpu", "phases", "phase_progress"}),
        gpu_ok=gpu.ok,
        gpu_error=gpu.error or "",
        gpus=[g.model_dump() for g in gpu.gpus],
        phase_progress=payload.phase_progress.reported() if payload.phase_progress else None,
    )
    if payload.phases is not None:
        record_phases(request.auth.pk, payload.phases.ages(), now=now)
    return record_heartbeat(request.auth, beat, now=now)


@router.post("/checkpoints")
def create_checkpoint(request: HttpRequest, payload: CheckpointIn) -> dict:
    attempt: Attempt = request.auth
    if payload.encrypted != attempt.job.encrypt_checkpoints:
        wanted = "encrypted" if attempt.job.encrypt_checkpoints else "plain"
        raise HttpError(409, f"this job stores {wanted} checkpoints")
    try:
        plan = records.plan_upload(
            attempt, step=payload.step, size=payload.size, encrypted=payload.encrypted
        )
    except records.CheckpointRefused as exc:
        raise HttpError(409, str(exc)) from exc
    return {"checkpoint_id": plan.checkpoint.pk, "upload": plan.upload}


@router.post("/checkpoints/{checkpoint_id}/complete")
def complete_checkpoint(request: HttpRequest, checkpoint_id: int, payload: CompleteIn) -> dict:
    attempt: Attempt = request.auth
    checkpoint = Checkpoint.objects.filter(pk=checkpoint_id, attempt=attempt).first()
    if checkpoint is None:
        raise HttpError(404, f"no checkpoint {checkpoint_id} in this attempt")
    try:
        done = records.complete_upload(
            checkpoint,
            size=payload.size,
            sha256=payload.sha256,
            parts=[(p.part_number, p.etag) for p in payload.parts],
            now=timezone.now(),
        )
    except records.CheckpointRefused as exc:
        raise HttpError(409, str(exc)) from exc
    records.prune_old(attempt.job_id, keep_last=attempt.job.keep_last)
    return {"ready": True, "step": done.step}


@router.post("/exit")
def report_exit(request: HttpRequest, payload: ExitIn) -> dict:
    record_exit(
        request.auth,
        exit_code=payload.exit_code,
        reason=payload.reason,
        error=payload.error or "",
        log_tail=payload.log_tail,
        now=timezone.now(),
    )
    return {}


@router.get("/bootstrap.sh", auth=AgentToken(racer=auth.RACER_FETCHES))
def bootstrap_script(request: HttpRequest) -> HttpResponse:
    """The attempt's bootstrap again (the token is the one the caller already holds)."""
    token = request.headers["Authorization"].split(" ", 1)[1]
    text = bootstrap.render_bootstrap(request.auth, token=token)
    return HttpResponse(text, content_type="text/x-shellscript")


@router.get("/agent.pyz", auth=AgentToken(racer=auth.RACER_FETCHES))
def agent_zipapp(request: HttpRequest) -> FileResponse:
    path = bootstrap.agent_zipapp_path()
    return FileResponse(path.open("rb"), content_type="application/zip", filename="agent.pyz")
