"""What an agent is told when it registers: what to run, where to resume from, its code, its
staged files and its secrets; and what becomes of a job whose code is gone.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from jobs import lifecycle
from jobs.agent_api.heartbeat import heartbeat_deadline
from jobs.agent_api.phases import first_reports
from jobs.checkpoints import interval as ci
from jobs.checkpoints import records, requests
from jobs.code import job_secrets
from jobs.code.for_agent import agent_workdir
from jobs.models import ON_HOST_STATES, Attempt, Checkpoint
from jobs.staging.for_agent import agent_stage
from nomadgpu.storage import object_store


def register_agent(
    attempt: Attempt, *, now: datetime, phases: dict[str, float] | None = None
) -> dict:
    """Record the agent's arrival and tell it what to run, where to resume from and whether the
    supervisor chooses when to checkpoint (``checkpoint.mode``).

    Idempotent while the attempt lives: an agent restarted in the same container registers
    again (its heartbeats' ``seq`` continue above the old ones by the clock, see PROTOCOL.md).
    PHASES (seconds before now, by name) may say when the container came up and the agent's
    dependencies were ready; the first call stands in for whichever is not said.
    """
    job = attempt.job
    resume = resume_instructions(job.pk)
    ages = {"deps_ready": 0.0, **(phases or {})}
    ages.setdefault("container_started", ages["deps_ready"])
    Attempt.objects.filter(pk=attempt.pk, state__in=ON_HOST_STATES).update(
        # The first registration (a phase of the recovery anatomy, and the GPU's start in
        # billing.spend only where the poll never read the instance running): an agent
        # restarted in the same container must not move it.
        registered_at=Coalesce(F("registered_at"), Value(now, output_field=DateTimeField())),
        last_heartbeat_at=now,
        heartbeat_deadline=heartbeat_deadline(attempt, now),
        resumed_from_step=resume["step"] if resume else 0,
        # The host's start deadline is met; its early phases set their own with their bytes
        # (heartbeat ``phase_progress``), counted again from 0 by a restarted agent.
        start_due_at=None,
        start_due_why="",
        start_progress={},
        **first_reports(ages, now),
    )
    return {
        "job_id": job.pk,
        "attempt_no": attempt.number,
        "command": job.command,
        # Several GPUs (PROTOCOL.md "Launchers"): the launcher the agent wraps the command in;
        # it starts one process per GPU of num_gpus below.
        "launcher": job.launcher or None,
        "env": job.env,
        "total_steps": job.total_steps,
        "heartbeat_interval_s": job.heartbeat_interval_s,
        # The GPUs the job has on its host (selection matches the offer's count exactly):
        # fewer visible to nvidia-smi is a GPU fault (PROTOCOL.md, ``gpu``), and a launcher
        # starts one process per GPU.
        "num_gpus": job_gpu_count(job),
        "checkpoint": {
            "keep_last": job.keep_last,
            "upload_part_size": records.PART_SIZE,
            "mode": ci.AUTO if requests.is_auto(job) else ci.SCRIPT,
        },
        "resume": resume,
        "encryption": _encryption(job),
        # The job's code (PROTOCOL.md, ``workdir``); raises packs.PackUnavailable.
        "workdir": agent_workdir(job),
        # The staged model files (PROTOCOL.md, ``stage``), laid out before the setup.
        "stage": agent_stage(job),
        # The one place a secret's value leaves the server for a host (jobs.code.job_secrets).
        "setup": job.setup,
        "secrets": job_secrets.register_secrets(job),
    }


def job_gpu_count(job) -> int:
    """The job's ``requirements.num_gpus`` (1 when unset, or not a number after a hand edit)."""
    return max(1, job.gpu_count())


def _encryption(job) -> dict | None:
    if not job.encrypt_checkpoints:
        return None
    return {"data_key_b64": job.data_key, "format": "ngck1"}


def resume_instructions(job_id: int) -> dict | None:
    checkpoint = Checkpoint.objects.filter(job_id=job_id).select_related("attempt").newest_ready()
    if checkpoint is None:
        return None
    store = object_store(checkpoint.attempt.job.team)
    return {
        "checkpoint_id": checkpoint.pk,
        "step": checkpoint.step,
        "encrypted": checkpoint.encrypted,
        "object": {
            "url": store.presign_get(checkpoint.key),
            "size": checkpoint.size,
            "sha256": checkpoint.sha256,
        },
    }


def fail_without_code(attempt: Attempt, *, why: str, now: datetime) -> None:
    """ATTEMPT's job cannot get its code (its pack is gone): no host can run it, so the job
    fails with WHY and what to do, and its machine is released. Not a host loss."""
    reason = f"{why}: submit the job again with its code"
    lifecycle.fail_job(attempt.job_id, why=reason, now=now)
