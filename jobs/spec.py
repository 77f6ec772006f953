"""The job spec: one validated shape for every way a job is submitted.

The CLI reads it from a TOML file (``examples/qlora/job.toml`` is one), the member API takes
it as a JSON body, and the portal's form builds it from its fields; all three go through
``JobSpec`` and ``submit_spec``, so a limit or a default is decided here once.

Shape: the job's own fields at the top level, ``env`` (added to the command's environment),
``requirements`` (what a host must have: ``hosts.selection.Requirements``) and ``profile``
(what the cost model multiplies: ``hosts.selection.JobProfile``). Unknown keys are errors, not
silently dropped: a typo in ``min_reliabilty`` must not rent an unreliable host.
"""

from __future__ import annotations

import re
import sys
import tomllib
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hosts.vast.parsing import BID_MAX_USD, BID_MIN_USD
from jobs import lifecycle

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The agent owns these: a job may not point its own agent elsewhere or change its token.
RESERVED_ENV_PREFIXES = ("NOMAD_",)

__all__ = [
    "JOB_TEMPLATES",
    "JobSpec",
    "ValidationError",
    "error_messages",
    "submit_spec",
    "template_spec",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class RequirementsSpec(_Strict):
    gpu_names: list[Annotated[str, Field(min_length=1, max_length=60)]] = Field(
        default_factory=list, max_length=20, description="acceptable GPU models; empty: any"
    )
    num_gpus: int = Field(1, ge=1, le=16)
    min_gpu_ram_gb: float = Field(0.0, ge=0, le=1024, description="per GPU, GiB")
    min_reliability: float = Field(0.98, ge=0, le=1)
    min_inet_down_mbps: float = Field(500.0, ge=0, le=100_000)
    # Vast refuses a create with less than 8 GB of disk (create_instance.yaml).
    disk_gb: float = Field(50.0, ge=8, le=20_000)
    min_cuda: float | None = Field(None, ge=0, le=99)
    verified_only: bool = True
    datacenter_only: bool = False
    max_dph: float | None = Field(None, gt=0, le=1000, description="max $/h (GPU + storage)")
    # On-demand, interruptible (a bid over min_bid: cheaper, outbid at any time) or the cheaper
    # expected total of the two, interruptions priced in (hosts.selection.expected_cost).
    rental: Literal["on-demand", "interruptible", "auto"] = "auto"
    # Vast takes bids from $0.001 to $128 per hour (create_instance: `price`).
    max_bid_dph: float | None = Field(
        None, ge=BID_MIN_USD, le=BID_MAX_USD, description="highest bid $/h for interruptible"
    )


class ProfileSpec(_Strict):
    image_gb: float = Field(5.0, ge=0, le=2000, description="compressed image pull")
    model_gb: float = Field(0.0, ge=0, le=5000, description="downloaded by the command")
    upload_gb: float = Field(1.0, ge=0, le=5000, description="all checkpoints of the run")
    checkpoint_gb: float = Field(0.0, ge=0, le=5000, description="downloaded before a resume")
    reference_seconds_per_step: float = Field(4.0, gt=0, le=86_400)
    reference_gpu: str = Field("RTX 4090", min_length=1, max_length=60)
    container_start_s: float = Field(60.0, ge=0, le=86_400)
    # Steps between the script's checkpoints (0: unknown, a tenth of the run): an interruption
    # redoes half of that on average (hosts.selection.expected_cost).
    checkpoint_every_steps: int = Field(0, ge=0, le=100_000_000)
    # Who decides when to checkpoint: the script alone, or also the supervisor, which asks for
    # one (``checkpoint_now``) every √(2·δ·MTBF) for the host it runs on (jobs.checkpoint_interval).
    checkpoint: Literal["script", "auto"] = "script"


class JobSpec(_Strict):
    name: str = Field(min_length=1, max_length=120)
    image: str = Field(min_length=1, max_length=300, pattern=r"^[^\s]+$")
    command: str = Field(min_length=1, max_length=10_000)
    env: dict[str, Annotated[str, Field(max_length=10_000)]] = Field(default_factory=dict)
    total_steps: int | None = Field(None, ge=1, le=100_000_000)
    # Fractions of a second are for drills and tests: every beat is a request to the portal.
    heartbeat_interval_s: float = Field(15, ge=0.2, le=600)
    keep_last: int = Field(3, ge=1, le=100)
    encrypt_checkpoints: bool = False
    start_timeout_s: int = Field(1200, ge=30, le=86_400)
    stall_timeout_s: int = Field(900, ge=30, le=7 * 86_400)
    max_script_retries: int = Field(0, ge=0, le=10)
    budget_usd: Decimal | None = Field(None, gt=0, le=1_000_000, decimal_places=2)
    start_when_budget_allows: bool = False
    requirements: RequirementsSpec = Field(default_factory=RequirementsSpec)
    profile: ProfileSpec = Field(default_factory=ProfileSpec)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        if len(env) > 200:
            raise ValueError("at most 200 variables")
        for key in env:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid variable name (letters, digits, _)")
            if key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"{key!r}: NOMAD_* variables are set by the agent")
        return env

    def job_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``jobs.lifecycle.submit_job``."""
        data = self.model_dump()
        data["requirements"] = self.requirements.model_dump()
        data["profile"] = self.profile.model_dump()
        return data


def error_messages(exc: ValidationError) -> dict[str, str]:
    """Pydantic's errors as ``{"requirements.num_gpus": "Input should be ..."}``."""
    out: dict[str, str] = {}
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "__all__"
        out.setdefault(where, err["msg"])
    return out


def submit_spec(spec: JobSpec, *, team, created_by, now: datetime):
    """Submit a validated spec for TEAM; returns the queued job. Raises
    ``jobs.spending.BudgetExceeded`` (a message with the numbers, nothing created) when the
    estimate would cross a spending limit and the spec does not ask to wait for the budget."""
    return lifecycle.submit_job(team=team, created_by=created_by, now=now, **spec.job_fields())


def _toy_template() -> dict[str, Any]:
    # The sandbox runs a command on this machine, so the toy uses this interpreter and checkout.
    return {
        "name": "toy",
        "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
        "command": f"{sys.executable} {settings.BASE_DIR / 'examples' / 'toy' / 'train.py'}",
        "env": {"TOY_STEPS": "300", "TOY_CHECKPOINT_EVERY": "50", "TOY_STEP_SECONDS": "0.2"},
        "total_steps": 300,
        "heartbeat_interval_s": 5,
        "requirements": {"gpu_names": ["RTX 4090"], "disk_gb": 20.0},
        "profile": {"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01},
    }


def _qlora_template() -> dict[str, Any]:
    path = settings.BASE_DIR / "examples" / "qlora" / "job.toml"
    return tomllib.loads(path.read_text())


# Pre-filled specs for the portal's "start from" menu and `nomadgpu submit --template`.
JOB_TEMPLATES = {
    "toy": ("Toy trainer (CPU, runs in the sandbox in a minute)", _toy_template),
    "qlora": ("Field report: QLoRA Qwen2.5-7B on one RTX 4090", _qlora_template),
}


def template_spec(name: str) -> dict[str, Any]:
    """The raw spec dict of template NAME (KeyError when unknown)."""
    return JOB_TEMPLATES[name][1]()
