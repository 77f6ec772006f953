"""The job spec: one validated shape for every way a job is submitted.

The CLI reads it from a TOML file (``examples/qlora/job.toml`` is one), the member API takes
it as a JSON body, and the portal's form builds it from its fields; all three go through
``JobSpec`` and ``submit_spec``, so a limit or a default is decided here once.

Shape: the job's own fields at the top level, ``env`` (added to the command's environment),
``requirements`` (what a host must have: ``hosts.selection.Requirements``) and ``profile``
(what the cost model multiplies: ``hosts.selection.JobProfile``). Unknown keys are errors, not
silently dropped: a typo in ``min_reliabilty`` must not rent an unreliable host. The defaults
here are the product's only ones: ``jobs.renting.terms`` reads a stored job through these
schemas too, so a key a job leaves out means the same at submit, at rent and in the budget.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent import launch
from hosts.selection.race import RACE_LIMIT
from hosts.vast.parsing import BID_MAX_USD, BID_MIN_USD
from jobs import lifecycle
from jobs.code import job_secrets, submit
from jobs.code.job_secrets import MissingSecret

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# The agent owns these: a job may not point its own agent elsewhere or change its token.
RESERVED_ENV_PREFIXES = ("NOMAD_",)


__all__ = [
    "EnvVars",
    "JobSpec",
    "MissingSecret",
    "ProfileSpec",
    "RequirementsSpec",
    "StageEntry",
    "ValidationError",
    "WorkdirSpec",
    "check_team_refs",
    "error_messages",
    "submit_spec",
]


def _env_names(env: dict[str, str]) -> dict[str, str]:
    if len(env) > 200:
        raise ValueError("at most 200 variables")
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"{key!r} is not a valid variable name (letters, digits, _)")
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(f"{key!r}: NOMAD_* variables are set by the agent")
    return env


# The command's extra environment: a type of its own, so a job's stored env is checked by the
# same rules (``jobs.stored_spec.validate_stored``).
EnvVars = Annotated[dict[str, Annotated[str, Field(max_length=10_000)]], AfterValidator(_env_names)]


def _secret_names(names: list[str]) -> list[str]:
    _env_names(dict.fromkeys(names, ""))
    if len(set(names)) != len(names):
        raise ValueError("a secret is named twice")
    return names


# Team secret names (``nomadgpu.models.TeamSecret``): each becomes a variable of the command's
# environment, so the same rules as ``env``; whether the team has them is checked at submit.
SecretName = Annotated[str, Field(min_length=1, max_length=64)]


SecretNames = Annotated[list[SecretName], Field(max_length=50), AfterValidator(_secret_names)]


def _race_setting(value: Any) -> str | int:
    """``race``: "auto", "off", or how many instances to create at once, 1 to ``RACE_LIMIT``
    (a number, or its digits as a stored job and a form give it)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, str) and value.strip().lower() in ("auto", "off"):
        return value.strip().lower()
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= RACE_LIMIT:
        return value
    raise ValueError(f'"auto", "off" or a number of instances from 1 to {RACE_LIMIT}')


# Hedged rents (``jobs.renting.race``): race when it pays, never, or always with N instances.
RaceSetting = Annotated[str | int, BeforeValidator(_race_setting)]


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
    # Vast's prices are the whole instance's, all num_gpus GPUs (hosts.vast.parsing), so the
    # caps are too: 4 GPUs at $0.40 each are $1.60/h.
    max_dph: float | None = Field(
        None, gt=0, le=1000, description="max $/h of the instance, all its GPUs (GPU + storage)"
    )
    # On-demand, interruptible (a bid over min_bid: cheaper, outbid at any time) or the cheaper
    # expected total of the two, interruptions priced in (hosts.selection.expected_cost).
    rental: Literal["on-demand", "interruptible", "auto"] = "auto"
    # Vast takes bids from $0.001 to $128 per hour (create_instance: `price`).
    max_bid_dph: float | None = Field(
        None,
        ge=BID_MIN_USD,
        le=BID_MAX_USD,
        description="highest bid $/h for interruptible, for the instance (all its GPUs)",
    )


class ProfileSpec(_Strict):
    image_gb: float = Field(5.0, ge=0, le=2000, description="compressed image pull")
    model_gb: float = Field(0.0, ge=0, le=5000, description="downloaded by the command")
    upload_gb: float = Field(1.0, ge=0, le=5000, description="all checkpoints of the run")
    checkpoint_gb: float = Field(0.0, ge=0, le=5000, description="downloaded before a resume")
    reference_seconds_per_step: float = Field(
        4.0, gt=0, le=86_400, description="s/step on requirements.num_gpus of reference_gpu"
    )
    reference_gpu: str = Field("RTX 4090", min_length=1, max_length=60)
    container_start_s: float = Field(60.0, ge=0, le=86_400)
    # Steps between the script's checkpoints (0: unknown, a tenth of the run): an interruption
    # redoes half of that on average (hosts.selection.expected_cost).
    checkpoint_every_steps: int = Field(0, ge=0, le=100_000_000)
    # Who decides when to checkpoint: the script alone, or also the supervisor, which asks for
    # one (``checkpoint_now``) every √(2·δ·MTBF) for the host it runs on
    # (jobs.checkpoints.interval).
    checkpoint: Literal["script", "auto"] = "script"


class ArchiveWorkdirSpec(_Strict):
    """Code from a pack the team uploaded (``POST /api/workdirs``), by its sha256."""

    kind: Literal["archive"]
    sha256: Annotated[str, AfterValidator(str.lower)] = Field(pattern=r"^[0-9a-fA-F]{64}$")


class GitWorkdirSpec(_Strict):
    """Code from a git repository at REF (resolved to a commit at submit)."""

    kind: Literal["git"]
    # No whitespace, no leading "-": the URL and ref reach git's command line.
    url: str = Field(min_length=1, max_length=2000, pattern=r"^[^\s-]\S*$")
    ref: str = Field("HEAD", min_length=1, max_length=255, pattern=r"^[^\s-]\S*$")
    deploy_key_secret: str = Field("", max_length=64, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")


WorkdirSpec = Annotated[ArchiveWorkdirSpec | GitWorkdirSpec, Field(discriminator="kind")]


# A Hugging Face repo id: ORG/NAME, each part as the Hub allows (letters, digits, "-_.").
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def _repo_id(repo: str) -> str:
    if not HF_REPO.match(repo):
        raise ValueError(f"{repo[:100]!r} is not a Hugging Face repo id (ORG/NAME)")
    return repo


def _relative_path(path: str) -> str:
    """Where a URL entry lands under $NOMAD_STAGE_DIR: relative, no "..", no empty part."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("a relative path without '..', '.' or empty parts (e.g. data/train.jsonl)")
    return path


StagePath = Annotated[
    str,
    Field(min_length=1, max_length=300, pattern=r"^[A-Za-z0-9._/-]+$"),
    AfterValidator(_relative_path),
]


class HfStageSpec(_Strict):
    """A Hugging Face model repo at REVISION (resolved to a commit when it is mirrored), all
    its files or those matching FILES (fnmatch globs, e.g. ``*.safetensors``)."""

    hf: Annotated[str, AfterValidator(_repo_id)]
    revision: str = Field("main", min_length=1, max_length=255, pattern=r"^[^\s]+$")
    files: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list, max_length=50
    )


class UrlStageSpec(_Strict):
    """One file from an http(s) URL, landing at ``$NOMAD_STAGE_DIR/PATH``."""

    url: str = Field(min_length=1, max_length=2000, pattern=r"^https?://\S+$")
    path: StagePath


def _stage_entry_kind(raw: Any) -> str | None:
    if isinstance(raw, dict):
        return "hf" if "hf" in raw else "url" if "url" in raw else None
    if isinstance(raw, HfStageSpec):
        return "hf"
    return "url" if isinstance(raw, UrlStageSpec) else None


def _distinct_stage(entries: list) -> list:
    paths = [e.path for e in entries if isinstance(e, UrlStageSpec)]
    if len(set(paths)) != len(paths):
        raise ValueError("two url entries land at the same path")
    return entries


# A ``stage`` entry: ``{hf = "ORG/NAME", revision = "main", files = [...]}`` or
# ``{url = "https://...", path = "name"}``; which one from the key it has.
StageEntry = Annotated[
    Annotated[HfStageSpec, Tag("hf")] | Annotated[UrlStageSpec, Tag("url")],
    Discriminator(
        _stage_entry_kind,
        custom_error_type="stage_entry",
        custom_error_message="a stage entry has either hf (a repo id) or url (with path)",
    ),
]


StageEntries = Annotated[list[StageEntry], Field(max_length=20), AfterValidator(_distinct_stage)]


# Fields a job stores only as submit resolves them (a git ref becomes its commit): not in
# ``job_fields``, and not edited through the spec afterwards (the Job admin shows them).
RESOLVED_AT_SUBMIT = frozenset({"workdir"})


class JobSpec(_Strict):
    name: str = Field(min_length=1, max_length=120)
    image: str = Field(min_length=1, max_length=300, pattern=r"^[^\s]+$")
    command: str = Field(min_length=1, max_length=10_000)
    env: EnvVars = Field(default_factory=dict)
    total_steps: int | None = Field(None, ge=1, le=100_000_000)
    # Fractions of a second are for drills and tests: every beat is a request to the portal.
    heartbeat_interval_s: float = Field(15, ge=0.2, le=600)
    keep_last: int = Field(3, ge=1, le=100)
    encrypt_checkpoints: bool = False
    start_timeout_s: int = Field(1200, ge=30, le=86_400)
    stall_timeout_s: int = Field(900, ge=30, le=7 * 86_400)
    max_script_retries: int = Field(0, ge=0, le=10)
    # Create k >= 2 instances on different machines and keep the first whose agent registers:
    # "auto" when the wait it saves is worth more than the losers cost, "off", or always N.
    race: RaceSetting = "auto"
    budget_usd: Decimal | None = Field(None, gt=0, le=1_000_000, decimal_places=3)
    start_when_budget_allows: bool = False
    requirements: RequirementsSpec = Field(default_factory=RequirementsSpec)
    profile: ProfileSpec = Field(default_factory=ProfileSpec)
    workdir: WorkdirSpec | None = None
    # Shell lines run once per host before the command (``bash -e``, in the work directory).
    setup: str = Field("", max_length=20_000)
    # Team secrets put in the command's environment (values only in the agent's register reply).
    secrets: SecretNames = Field(default_factory=list)
    # The team secret holding Vast's ``image_login`` of a private image: "-u USER -p TOKEN ghcr.io".
    image_login_secret: str = Field("", max_length=64, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    # Model weights and files mirrored once into the team's storage before the first rent and
    # laid out on every host before setup (``jobs.staging``; docs/staged-weights.md).
    stage: StageEntries = Field(default_factory=list)
    # One process per GPU of the job (``requirements.num_gpus``) started by torchrun or
    # ``accelerate launch`` around the command (``agent.launch``; docs/several-gpus.md);
    # None: the command runs as it is.
    launcher: Literal["torchrun", "accelerate"] | None = None

    @model_validator(mode="after")
    def _launch_fits_gpus(self) -> JobSpec:
        # A launcher around a command that launches itself, or a process count that is not
        # the GPU count, would start the wrong number of ranks on a host rented for the job.
        try:
            if self.launcher is not None:
                launch.check_launched_command(self.command)
        except launch.LaunchError as exc:
            raise ValueError(f"launcher = {self.launcher!r}: {exc}") from exc
        try:
            launch.check_process_count(self.command, self.requirements.num_gpus)
        except launch.LaunchError as exc:
            raise ValueError(f"command: {exc}") from exc
        return self

    @field_validator("secrets")
    @classmethod
    def _secrets_not_in_env(cls, secrets: list[str], info: ValidationInfo) -> list[str]:
        # env is declared first, so it is validated (and in info.data) by now, unless invalid.
        if both := sorted(set(secrets) & set(info.data.get("env") or {})):
            raise ValueError(f"{both[0]!r} is in env and in secrets: keep one")
        return secrets

    def job_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``jobs.lifecycle.submit_job`` (the workdir aside: it is
        stored as ``submit_spec`` resolves it)."""
        data = self.model_dump(exclude=RESOLVED_AT_SUBMIT)
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


def check_team_refs(spec: JobSpec, *, team) -> None:
    """Raise ``MissingSecret`` (the field and the sentence naming the secret) when SPEC names a
    secret TEAM does not have: a job must not rent a host for a command that cannot start."""
    job_secrets.refuse_missing(
        team, {"secrets": spec.secrets, "image_login_secret": [spec.image_login_secret]}
    )


def submit_spec(spec: JobSpec, *, team, created_by, now: datetime):
    """Submit a validated spec for TEAM; returns the queued job. Raises (nothing created)
    ``MissingSecret`` when it names a secret the team does not have, ``jobs.code.packs.
    WorkdirRefused`` for code that cannot be used (a pack not ready, a git ref that does not
    exist: resolved here, before any transaction), and ``jobs.spending.BudgetExceeded`` (a
    message with the numbers) when the estimate would cross a spending limit and the spec
    does not ask to wait for the budget."""
    check_team_refs(spec, team=team)
    workdir = submit.stored_workdir(spec.workdir, team=team, encrypted=spec.encrypt_checkpoints)
    fields = {**spec.job_fields(), "workdir": workdir}
    return lifecycle.submit_job(team=team, created_by=created_by, now=now, **fields)
