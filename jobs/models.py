from __future__ import annotations

import logging
from datetime import timedelta

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
    # Spending limit for this job in USD (team limits live in billing); None: no job limit.
    budget_usd = models.DecimalField(max_digits=10, decimal_places=2, null=True, blank=True)
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

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["team", "state"]),
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
