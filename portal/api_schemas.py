"""The member API's shapes: what a submit may send (``SubmitIn``, the job spec) and what each
answer holds (``JobOut``, ``JobDetailOut``, events, logs, a drill), with their limits. The
router and its endpoints are ``portal.member_api``.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from ninja import Field, Schema

from jobs.spec import JobSpec


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
