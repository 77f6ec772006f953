"""The job: what to run and on what, its states and its *shape* (what earlier runs of the same
job measured is found by it)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
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


# Named sets of states, read through ``JobQuerySet`` (``Job.objects.active()``) or, for one job
# in hand, as ``job.state in ACTIVE_STATES``.
# A job the supervisor works on: waiting for a host, renting, on one, or between two.
ACTIVE_STATES = (
    JobState.QUEUED,
    JobState.RENTING,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.RECOVERING,
)
# Of those, the ones past the queue: a host is being rented, held or replaced.
STARTED_STATES = ACTIVE_STATES[1:]
# Waiting for a host: the watchdog plans a rent for each (with no live attempt).
NEEDS_HOST_STATES = (JobState.QUEUED, JobState.RENTING, JobState.RECOVERING)
# Over for good: nothing moves such a job again.
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class JobQuerySet(models.QuerySet):
    """Jobs by what state they are in, by name: ``Job.objects.active()``."""

    def active(self) -> JobQuerySet:
        """Jobs the supervisor works on (``ACTIVE_STATES``): queued to recovering."""
        return self.filter(state__in=ACTIVE_STATES)

    def started(self) -> JobQuerySet:
        """Active jobs past the queue (``STARTED_STATES``): they hold, or are getting, a host."""
        return self.filter(state__in=STARTED_STATES)

    def needs_host(self) -> JobQuerySet:
        """Jobs waiting for a host (``NEEDS_HOST_STATES``)."""
        return self.filter(state__in=NEEDS_HOST_STATES)

    def unfinished(self) -> JobQuerySet:
        """Jobs not over for good: active, paused, or held for attention."""
        return self.exclude(state__in=TERMINAL_STATES)


def shape_of(*, image: str, command: str, setup: str, num_gpus: int) -> str:
    """The key of a job's *shape*: two jobs of one team with the same key are the same job run
    again, so what the earlier one measured (``jobs.renting.shape_history``) corrects the later
    one's estimate. The key is the program and the GPUs it runs on: the image, the setup, the
    command, and the number of GPUs (the speed is measured at that count; the GPU model is not
    in it, since speeds are kept per model and scaled between them).

    Left out, so that they never reset what was learnt: the name (a label: "toy" and "toy-2"
    run the same program), the env (a batch size or a learning rate moves the speed a little,
    and the figures are medians of the newest runs, so they follow such a change within a few
    runs; env also carries switches that change nothing, such as ``HF_HUB_OFFLINE`` or a W&B
    project), the steps (the figures are per step or per host), the code (a new commit is the
    same job), the requirements' filters and the typed profile. A change that really makes
    another job (another model, twice the sequence length) belongs on the command line or in
    the image: ``python train.py --model 7b`` is a new shape, estimated as typed until it has
    run once (docs/budgets-and-costs.md, "Estimates that learn")."""
    parts = [image, command, setup, int(num_gpus or 1)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


# The most GPUs a job may ask for (``jobs.spec.RequirementsSpec.num_gpus``).
MAX_NUM_GPUS = 16


def shape_family(*, image: str, command: str, setup: str) -> dict[int, str]:
    """``shape_of`` the same job at every GPU count it may ask for, by count: where the speed
    measured at another count is found when none was at the job's own
    (``jobs.renting.shape_history``)."""
    return {
        n: shape_of(image=image, command=command, setup=setup, num_gpus=n)
        for n in range(1, MAX_NUM_GPUS + 1)
    }


SHAPE_FIELDS = frozenset({"image", "command", "setup", "requirements"})


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
    # Hedged rents (``jobs.renting.race``): "auto" (race when it pays), "off" (one instance at
    # a time) or a number of instances to create at once ("2"); JobSpec's ``race``.
    race = models.CharField(max_length=8, default="auto")
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

    objects = JobQuerySet.as_manager()

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
        return {"image": self.image, "command": self.command, "setup": self.setup}

    @property
    def storage_prefix(self) -> str:
        return f"teams/{self.team.slug}/jobs/{self.pk}/"

    @property
    def heartbeat_timeout(self) -> timedelta:
        """Silence longer than this is a lost host (``HEARTBEAT_TIMEOUT_INTERVALS``: a silent
        network loss is caught within two heartbeat intervals, one lost beat is forgiven)."""
        return timedelta(seconds=self.heartbeat_interval_s * HEARTBEAT_TIMEOUT_INTERVALS)
