from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from nomadgpu.fields import EncryptedTextField
from nomadgpu.models import Team

# Silence longer than this many heartbeat intervals is a lost host. 1.75 catches a silent
# network loss within two intervals (the watchdog adds up to one tick, a third of an interval)
# and still forgives one lost heartbeat: the agent retries a failed beat after 1, 2, 4 s, long
# before the timeout. Three intervals would take 45-50 s at 15 s beats. A host whose network
# drops for longer than ~11 s at 15 s beats is treated as lost; jobs on flaky networks should
# use a longer heartbeat_interval_s.
HEARTBEAT_TIMEOUT_INTERVALS = 1.75


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RENTING = "renting", "Renting"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    RECOVERING = "recovering", "Recovering"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PAUSED_BUDGET = "paused_budget", "Paused (budget)"
    # Stopped until a person fixes the job itself (its stored spec no longer validates): the
    # rent loop would only fail the same way again.
    NEEDS_ATTENTION = "needs_attention", "Needs attention"


def shape_of(
    *, name: str, image: str, command: str, setup: str, env: dict[str, Any], num_gpus: int
) -> str:
    """The key of a job's *shape*: two jobs of one team with the same key are the same job run
    again, so what the earlier one measured (``jobs.measured``) corrects the later one's
    estimate. The name alone would mix a 0.2 s toy with a 4 s one renamed alike; a digest of
    the workdir would make every new commit a stranger. So: the name, the image, the command,
    the setup, the environment (hyperparameters live there) and the number of GPUs (the speed
    is measured at that count); not the steps (the figures are per step or per host), the
    code, the requirements' filters or the typed profile."""
    parts = [name, image, command, setup, sorted((env or {}).items()), int(num_gpus or 1)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


# The most GPUs a job may ask for (``jobs.spec.RequirementsSpec.num_gpus``).
MAX_NUM_GPUS = 16


def shape_family(
    *, name: str, image: str, command: str, setup: str, env: dict[str, Any]
) -> dict[int, str]:
    """``shape_of`` the same job at every GPU count it may ask for, by count: where the speed
    measured at another count is found when none was at the job's own (``jobs.measured``)."""
    return {
        n: shape_of(name=name, image=image, command=command, setup=setup, env=env, num_gpus=n)
        for n in range(1, MAX_NUM_GPUS + 1)
    }


SHAPE_FIELDS = frozenset({"name", "image", "command", "setup", "env", "requirements"})


class Job(models.Model):
    """A fine-tuning job: what to run and on what. Its attempts are rentals of hosts."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="jobs"
    )
    name = models.CharField(max_length=120)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    image = models.CharField(max_length=300)
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)
    total_steps = models.PositiveIntegerField(null=True, blank=True)
    # Seconds; fractions are allowed (down to JobSpec's 0.2 s) so drills and tests need not wait.
    heartbeat_interval_s = models.FloatField(default=15.0)
    keep_last = models.PositiveSmallIntegerField(default=3)
    encrypt_checkpoints = models.BooleanField(default=False)
    # What to rent (hosts.selection.Requirements fields) and what the cost model needs
    # (image/model download sizes, reference seconds per step).
    requirements = models.JSONField(default=dict, blank=True)
    profile = models.JSONField(default=dict, blank=True)
    start_timeout_s = models.PositiveIntegerField(default=1200)
    stall_timeout_s = models.PositiveIntegerField(default=900)
    max_script_retries = models.PositiveSmallIntegerField(default=0)
    # The team's own fine-tune (agent/PROTOCOL.md "Code, setup and secrets"): its code
    # (``workdir``: {} none; {"kind": "archive", "sha256": ...} a WorkdirPack of the team;
    # {"kind": "git", "url", "ref", "commit", "deploy_key_secret"}), shell lines run once on
    # each host before the command (``setup``), the names of the team secrets the command gets
    # in its environment (``secrets``; values never leave the register call), and the secret
    # holding the registry login of a private image (``image_login_secret``).
    workdir = models.JSONField(default=dict, blank=True)
    setup = models.TextField(blank=True)
    secrets = models.JSONField(default=list, blank=True)
    image_login_secret = models.CharField(max_length=64, blank=True)
    # Model weights and files mirrored into the team's storage before the first rent
    # (``jobs.staging``): ``stage`` the entries as submitted (``jobs.spec`` StageEntry), and
    # ``stage_state`` "" (nothing to stage), "staging" (the planner waits), "ready" or "failed".
    stage = models.JSONField(default=list, blank=True)
    stage_state = models.CharField(max_length=10, blank=True)
    # "torchrun" or "accelerate": one process per GPU (requirements.num_gpus) started around
    # the command by the agent (agent.launch); None runs the command as it is. NULL, not "":
    # the admin reads a job back through JobSpec, whose "no launcher" is None.
    launcher = models.CharField(max_length=20, null=True, blank=True, default=None)  # noqa: DJ001
    staged_objects = models.ManyToManyField("StagedObject", blank=True, related_name="jobs")
    # Spending limit for this job in USD (team limits live in billing); None: no job limit.
    budget_usd = models.DecimalField(max_digits=10, decimal_places=3, null=True, blank=True)
    # Asked at submit: wait in the queue until the budget allows, instead of being refused.
    start_when_budget_allows = models.BooleanField(default=False)
    # Machines that failed this job; selection skips them.
    avoid_machine_ids = models.JSONField(default=list, blank=True)
    # When the re-rent loop may try again after finding no offer (backoff with a cap).
    next_rent_at = models.DateTimeField(null=True, blank=True)
    rent_backoff_s = models.PositiveIntegerField(default=0)
    final_step = models.PositiveIntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Per-job data key for checkpoint encryption, sealed under FIELD_ENCRYPTION_KEY (the KEK).
    data_key = EncryptedTextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    # ``shape_of`` the fields above, kept in step by ``save``: the team's earlier runs of the
    # same shape are what its estimates learn from.
    shape = models.CharField(max_length=32, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["team", "state"]),
            models.Index(fields=["team", "shape"]),
            # The watchdog's jobs waiting for a host: a handful among many finished jobs.
            models.Index(
                fields=["next_rent_at"],
                condition=models.Q(
                    state__in=[JobState.QUEUED, JobState.RENTING, JobState.RECOVERING]
                ),
                name="job_needs_host_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """Save, with ``shape`` recomputed (an admin's edit of the command makes a new shape)."""
        self.shape = self.shape_key()
        fields = kwargs.get("update_fields")
        if fields is not None and SHAPE_FIELDS & set(fields):
            kwargs["update_fields"] = {*fields, "shape"}
        super().save(*args, **kwargs)

    def gpu_count(self) -> int:
        """The GPUs the job asks for (a hand-edited count that is no number counts 1)."""
        try:
            return int((self.requirements or {}).get("num_gpus") or 1)
        except (TypeError, ValueError, AttributeError):
            return 1

    def shape_key(self) -> str:
        """``shape_of`` this job's fields at ``gpu_count``."""
        return shape_of(num_gpus=self.gpu_count(), **self._shape_parts())

    def shape_family(self) -> dict[int, str]:
        """``shape_family`` of this job's fields: its shape at each GPU count."""
        return shape_family(**self._shape_parts())

    def _shape_parts(self) -> dict[str, Any]:
        env = self.env if isinstance(self.env, dict) else {}
        return {"name": self.name, "image": self.image, "command": self.command,
                "setup": self.setup, "env": env}  # fmt: skip

    @property
    def storage_prefix(self) -> str:
        return f"teams/{self.team.slug}/jobs/{self.pk}/"

    @property
    def heartbeat_timeout(self) -> timedelta:
        """Silence longer than this is a lost host (``HEARTBEAT_TIMEOUT_INTERVALS``: a silent
        network loss is caught within two heartbeat intervals, one lost beat is forgiven)."""
        return timedelta(seconds=self.heartbeat_interval_s * HEARTBEAT_TIMEOUT_INTERVALS)


# One console line per job event: what an operator watching `make run` wants to see.
event_log = logging.getLogger("nomadgpu.events")
WARNING_EVENTS = frozenset({"host_lost", "failed", "no_offers", "budget_paused"})


class JobEventManager(models.Manager):
    def record(self, job_id: int, *, now, kind: str, message: str = "", data=None) -> JobEvent:
        """Append an event to JOB_ID's history (any app may: billing flags an invoice here).
        Notifications follow from the row itself (``notify`` listens for new events), and the
        console line is written once the transaction commits."""
        event = self.create(
            job_id=job_id, created_at=now, kind=kind, message=message, data=data or {}
        )
        transaction.on_commit(lambda: _log_event(event))
        return event


def _log_event(event: JobEvent) -> None:
    level = logging.WARNING if event.kind in WARNING_EVENTS else logging.INFO
    text = f"job {event.job_id}: {event.kind.replace('_', ' ')}"
    event_log.log(level, f"{text}: {event.message}" if event.message else text)


class JobEvent(models.Model):
    """Append-only history of a job: every transition and notable observation."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    objects = JobEventManager()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class AttemptState(models.TextChoices):
    PLANNED = "planned", "Planned"  # row committed, provider not called yet
    REQUESTED = "requested", "Requested"  # create sent; outcome may be unknown
    STARTING = "starting", "Starting"  # instance exists, agent not yet training
    RUNNING = "running", "Running"
    ENDED = "ended", "Ended"


LIVE_ATTEMPT_STATES = [
    AttemptState.PLANNED,
    AttemptState.REQUESTED,
    AttemptState.STARTING,
    AttemptState.RUNNING,
]
# Of those, the ones with a host: it bills, and its agent may talk to us.
ON_HOST_STATES = [AttemptState.STARTING, AttemptState.RUNNING]


class AttemptQuerySet(models.QuerySet):
    def live(self) -> AttemptQuerySet:
        """Attempts that hold, or are getting, the job's one slot (planned to running)."""
        return self.filter(state__in=LIVE_ATTEMPT_STATES)


class Attempt(models.Model):
    """One rental of one host for one job, with its own agent token and checkpoint prefix."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(
        max_length=12, choices=AttemptState.choices, default=AttemptState.PLANNED
    )
    end_reason = models.CharField(max_length=40, blank=True)

    # What was rented, copied from the offer (units: $/h, $/GB-hour, $/GB).
    offer_id = models.BigIntegerField(null=True, blank=True)
    instance_id = models.BigIntegerField(null=True, blank=True, unique=True)
    label = models.CharField(max_length=120, blank=True)
    machine_id = models.BigIntegerField(null=True, blank=True)
    gpu_name = models.CharField(max_length=60, blank=True)
    # The GPU $/h paid: the offer's dph_base on demand, the bid for an interruptible rental.
    dph_base = models.FloatField(default=0)
    # "on-demand" or "interruptible"; a bid is min_bid x (1 + bid_margin) at the rent.
    rental = models.CharField(max_length=16, default="on-demand")
    bid_margin = models.FloatField(null=True, blank=True)
    # Outbids answered by raising the bid (the attempt went on): they count in the team's
    # interruption rates with the Interruption rows of the outbids that moved the job.
    outbids = models.PositiveSmallIntegerField(default=0)
    storage_usd_per_gb_hour = models.FloatField(default=0)
    download_usd_per_gb = models.FloatField(default=0)
    upload_usd_per_gb = models.FloatField(default=0)
    disk_gb = models.FloatField(default=0)

    # The agent's bearer token: a lookup prefix and a SHA-256 digest, never the token itself.
    token_prefix = models.CharField(max_length=16, unique=True, null=True, blank=True)
    token_digest = models.CharField(max_length=64, blank=True)
    # Why this host: the selection's decision (chosen offer, top candidates, cost breakdowns).
    decision = models.JSONField(default=dict, blank=True)
    provider_status = models.CharField(max_length=20, blank=True)
    # The provider's own words with it (Vast's status_msg): why a start is stuck, say.
    provider_status_msg = models.CharField(max_length=500, blank=True)
    # When the host's contract ends (Vast's end_date: the instance is stopped then, for good),
    # and when the watchdog asked for the checkpoint that moves the job off it before that.
    contract_ends_at = models.DateTimeField(null=True, blank=True)
    move_asked_at = models.DateTimeField(null=True, blank=True)
    provider_unknown_polls = models.PositiveSmallIntegerField(default=0)
    # Its host went offline and the watchdog chose to wait for it (``hosts.wait_or_move``):
    # since when, and the seconds of earlier offline spells it waited out (Vast bills neither
    # GPU nor storage while the host is offline, so spend leaves them out).
    offline_since = models.DateTimeField(null=True, blank=True)
    offline_s = models.FloatField(default=0)
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True)

    # Written by each heartbeat (one indexed row update); read by the watchdog.
    registered_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_deadline = models.DateTimeField(null=True, blank=True)
    last_seq = models.BigIntegerField(default=-1)
    phase = models.CharField(max_length=12, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    total_steps = models.PositiveIntegerField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    seconds_per_step = models.FloatField(null=True, blank=True)
    last_progress_at = models.DateTimeField(null=True, blank=True)
    gpu_ok = models.BooleanField(null=True)
    gpu_error = models.CharField(max_length=300, blank=True)
    # The latest beat's GPUs, one object each (agent_api.GpuIn): index, bus id, name,
    # utilisation, memory, temperature, uncorrected ECC errors and an error where one is lost.
    gpus = models.JSONField(default=list, blank=True)
    bytes_down = models.PositiveBigIntegerField(default=0)
    bytes_up = models.PositiveBigIntegerField(default=0)
    # Everything the container moved since its agent started (the agent's own bytes, the
    # training command's downloads): Vast bills every byte, so spend counts the larger total.
    net_rx_bytes = models.PositiveBigIntegerField(default=0)
    net_tx_bytes = models.PositiveBigIntegerField(default=0)
    # The traffic Vast billed for this instance, as of the last invoice import (null: none yet),
    # and the moment that import covers (``billing.reconcile.note_billed_traffic``).
    billed_download_usd = models.FloatField(null=True, blank=True)
    billed_upload_usd = models.FloatField(null=True, blank=True)
    billed_through = models.DateTimeField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    pending_command = models.CharField(max_length=20, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    requested_at = models.DateTimeField(null=True, blank=True)
    # Who claimed the rent ("host:pid:start", ``jobs.rent_claims``) and when a create was sent
    # to the provider: a claim whose process died is settled at once, and only a create that
    # was sent can have made an instance to adopt.
    rent_claimed_by = models.CharField(max_length=120, blank=True)
    create_sent_at = models.DateTimeField(null=True, blank=True)
    rented_at = models.DateTimeField(null=True, blank=True)
    running_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    # Phase boundaries on this host (server clock; the agent reports each as seconds before
    # its call, so the host's clock never matters), each kept from its first report: the
    # container came up (the bootstrap's start, else the agent's first call), the agent's
    # dependencies were installed (the bootstrap's report, else the agent's start), the resume
    # checkpoint's last byte arrived and it was unpacked, the command started, and the first
    # step was reported. ``jobs.anatomy`` turns them into an interruption's downtime phases.
    container_started_at = models.DateTimeField(null=True, blank=True)
    deps_ready_at = models.DateTimeField(null=True, blank=True)
    restore_downloaded_at = models.DateTimeField(null=True, blank=True)
    restore_unpacked_at = models.DateTimeField(null=True, blank=True)
    command_started_at = models.DateTimeField(null=True, blank=True)
    first_step_at = models.DateTimeField(null=True, blank=True)
    # The job's code fetched and unpacked (or cloned) on this host, and its setup finished:
    # phases of the recovery anatomy between the agent's bootstrap and the checkpoint download.
    workdir_ready_at = models.DateTimeField(null=True, blank=True)
    setup_done_at = models.DateTimeField(null=True, blank=True)
    # The staged model files laid out on this host (``jobs.staging``): the anatomy's "model
    # download" phase, between the code and the setup.
    stage_done_at = models.DateTimeField(null=True, blank=True)

    objects = AttemptQuerySet.as_manager()

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_number_per_job"),
            # Exactly-once renting: at most one live attempt per job on every code path.
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(state__in=LIVE_ATTEMPT_STATES),
                name="one_live_attempt_per_job",
            ),
        ]
        indexes = [
            # The watchdog's one query: live attempts whose heartbeat deadline has passed.
            models.Index(
                fields=["heartbeat_deadline"],
                condition=models.Q(state__in=[AttemptState.STARTING, AttemptState.RUNNING]),
                name="attempt_due_idx",
            ),
            # nudge_planned: planned attempts are few and short-lived.
            models.Index(
                fields=["created_at"],
                condition=models.Q(state=AttemptState.PLANNED),
                name="attempt_planned_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job} #{self.number}"

    @property
    def storage_prefix(self) -> str:
        return f"{self.job.storage_prefix}attempts/{self.number}/"


class CheckpointState(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    PRUNED = "pruned", "Pruned"


class CheckpointQuerySet(models.QuerySet):
    def ready(self) -> CheckpointQuerySet:
        """Checkpoints a resume may start from: verified, manifest written, not pruned."""
        return self.filter(state=CheckpointState.READY)

    def newest_first(self) -> CheckpointQuerySet:
        """Highest step first; of two at one step (two attempts), the later upload."""
        return self.order_by("-step", "-ready_at")

    def newest_ready(self) -> Checkpoint | None:
        """The ready checkpoint a resume starts from, or None."""
        return self.ready().newest_first().first()

    def newest_ready_step(self) -> int | None:
        """The step of ``newest_ready``, in one query, or None."""
        return self.ready().newest_first().values_list("step", flat=True).first()

    def upload_seconds(self, newest: int) -> list[float]:
        """How long the NEWEST uploads took, the agent asking for targets to ready (what a
        checkpoint costs: budget enforcement's lead, the adaptive interval's δ)."""
        rows = (
            self.filter(ready_at__isnull=False)
            .order_by("-ready_at")
            .values_list("created_at", "ready_at")[:newest]
        )
        return [(ready - created).total_seconds() for created, ready in rows if ready >= created]


class WorkdirPackState(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    READY = "ready", "Ready"


class WorkdirPack(models.Model):
    """A team's packed code folder (a gzipped tar), stored once by content: the sha256 of the
    pack (before encryption) names it, so submitting unchanged code uploads nothing. An
    encrypted pack (for jobs that encrypt their checkpoints) is ngck1 under its own data key,
    sealed here; agents get the key over their register call."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="workdir_packs")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField(help_text="bytes of the pack before encryption")
    encrypted = models.BooleanField(default=False)
    # The object as stored (ngck1 bytes when encrypted, else the pack itself): what an agent
    # downloads and verifies.
    stored_sha256 = models.CharField(max_length=64, blank=True)
    stored_size = models.PositiveBigIntegerField(null=True, blank=True)
    data_key = EncryptedTextField(blank=True)
    state = models.CharField(
        max_length=12, choices=WorkdirPackState.choices, default=WorkdirPackState.UPLOADING
    )
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "sha256", "encrypted"], name="one_pack_per_content"
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.team.slug} code {self.sha256[:12]} ({self.size} B)"

    @property
    def key(self) -> str:
        """Where it lies in the team's storage."""
        suffix = "tar.gz.ngck1" if self.encrypted else "tar.gz"
        return f"teams/{self.team.slug}/workdirs/{self.sha256}.{suffix}"


class StagedObjectState(models.TextChoices):
    MIRRORING = "mirroring", "Mirroring"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class StagedObject(models.Model):
    """One ``stage`` entry mirrored into a team's storage, once: a Hugging Face repo at one
    resolved commit (with the file globs asked for), or one URL. ``source`` names it
    (``hf:ORG/NAME@COMMIT:GLOBS`` or ``url:URL``), so a second job with the same entry reuses
    it. ``files`` lists what is stored: ``{path, size, sha256, etag, key, stored_size,
    stored_sha256}`` each; ``data_key`` (sealed) encrypts them all for jobs that encrypt."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="staged_objects")
    kind = models.CharField(max_length=4)  # "hf" | "url"
    source = models.CharField(max_length=600)
    encrypted = models.BooleanField(default=False)
    repo = models.CharField(max_length=200, blank=True)
    revision = models.CharField(max_length=255, blank=True)
    commit = models.CharField(max_length=64, blank=True)
    files = models.JSONField(default=list, blank=True)
    state = models.CharField(
        max_length=10, choices=StagedObjectState.choices, default=StagedObjectState.MIRRORING
    )
    error = models.TextField(blank=True)
    files_total = models.PositiveIntegerField(default=0)
    files_done = models.PositiveIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0)
    data_key = EncryptedTextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "source", "encrypted"], name="one_staged_object_per_source"
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.team.slug} staged {self.source[:80]}"

    @property
    def prefix(self) -> str:
        """Where its files lie in the team's storage: by content (the resolved commit, or a
        digest of the URL), never by job."""
        digest = hashlib.sha256(f"{self.source}:{self.encrypted}".encode()).hexdigest()[:24]
        return f"teams/{self.team.slug}/stage/{digest}/"


class Checkpoint(models.Model):
    """A packed checkpoint object; ready only once verified and its manifest written (last)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    state = models.CharField(
        max_length=10, choices=CheckpointState.choices, default=CheckpointState.UPLOADING
    )
    key = models.CharField(max_length=400, db_index=True)  # the local store's write guard
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    encrypted = models.BooleanField(default=False)
    upload_id = models.CharField(max_length=200, blank=True)
    part_size = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["job", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "step"], name="one_checkpoint_per_step")
        ]
        indexes = [models.Index(fields=["job", "state", "-step"])]

    def __str__(self) -> str:
        return f"{self.job} step {self.step} ({self.state})"


class Interruption(models.Model):
    """A host lost under a job: when it was last heard, detected, replaced and running again.

    Every status-page number comes from these rows.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="interruptions")
    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="interruption")
    cause = models.CharField(max_length=40)
    detail = models.CharField(max_length=300, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    detected_at = models.DateTimeField()
    replacement_rented_at = models.DateTimeField(null=True, blank=True)
    running_again_at = models.DateTimeField(null=True, blank=True)
    step_reached = models.PositiveIntegerField(null=True, blank=True)
    resumed_step = models.PositiveIntegerField(null=True, blank=True)
    cancelled_before_recovery = models.BooleanField(default=False)
    # The attempt that ran again (set when the interruption closes): its phase boundaries
    # are the recovery's anatomy (``jobs.anatomy.breakdown``).
    replacement = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-detected_at"]
        indexes = [models.Index(fields=["detected_at"])]

    def __str__(self) -> str:
        return f"{self.job} lost host ({self.cause}) at {self.detected_at:%Y-%m-%d %H:%M:%S}"


class LossPoint(models.Model):
    """A sample of the training loss for the job page's chart.

    Written by the heartbeat only when the step crosses into a new bucket of
    ``loss_sample_every(total_steps)`` steps (about 100 points per job), never on every beat.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="loss_points")
    step = models.PositiveIntegerField()
    loss = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="one_loss_point_per_step")
        ]

    def __str__(self) -> str:
        return f"{self.job} step {self.step}: {self.loss:.4f}"


LOSS_POINTS_PER_JOB = 100


def loss_sample_every(total_steps: int | None) -> int:
    """Steps between two loss samples: about ``LOSS_POINTS_PER_JOB`` per job (every 10 steps
    when the total is unknown)."""
    if not total_steps:
        return 10
    return max(1, total_steps // LOSS_POINTS_PER_JOB)
