"""An attempt: one rental of one host for one job (there is no separate rental model), with
its own agent token and checkpoint prefix."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models.job import Job


# The instance label, ``ngpu:<env>:<job>:<attempt>``, written on every create: how a create
# whose outcome was lost is found again and adopted, and how the reaper tells our instances (of
# this environment) from everyone else's. One home for the format, both ways.
def label_for(job: Job, number: int) -> str:
    """The instance label of JOB's attempt NUMBER: how a lost create is found again."""
    return f"ngpu:{settings.NOMADGPU_ENV}:{job.pk}:{number}"


def parse_label(label: str | None) -> tuple[int, int] | None:
    """(job id, attempt number) from one of our labels in this environment, else None. A
    racer's label (``ngpu:<env>:<job>:<attempt>.<k>``, ``jobs.models.racer``) reads as its
    attempt's."""
    prefix = f"ngpu:{settings.NOMADGPU_ENV}:"
    if not label or not label.startswith(prefix):
        return None
    try:
        job_id, number = label[len(prefix) :].split(":")
        attempt, dot, racer = number.partition(".")
        if dot and not racer.isdigit():
            return None
        return int(job_id), int(attempt)
    except ValueError:
        return None


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
    # How many instances this attempt raced (``jobs.models.racer``): 0 for a plain rent. While
    # its race is open the attempt is starting with no instance; the winner's instance, token
    # and rates become the attempt's, and the others' costs are its too (``billing.spend``).
    raced = models.PositiveSmallIntegerField(default=0)
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
    # The moments the provider poll first read ``loading`` (the image pull and container start)
    # and ``running`` (Vast bills the GPU from it, docs/vast-api.md §7) for this instance:
    # ``billing.spend`` records GPU time from the latter and ``billing.image_pull`` reads the pull
    # from the former. Each kept from its first read.
    provider_loading_at = models.DateTimeField(null=True, blank=True)
    provider_running_at = models.DateTimeField(null=True, blank=True)
    # What Docker's words in the status_msg said of the image while it loaded, as the poll
    # first read them (``hosts.vast.image_pull_seen``): "pulled", "kept", or "" (none read).
    provider_pull_seen = models.CharField(max_length=8, blank=True)
    # Its host went offline and the watchdog chose to wait for it (``hosts.wait_or_move``):
    # since when, and the seconds of earlier offline spells it waited out (Vast bills neither
    # GPU nor storage while the host is offline, so spend leaves them out).
    offline_since = models.DateTimeField(null=True, blank=True)
    offline_s = models.FloatField(default=0)
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True)
    # A fire drill destroyed this host on purpose (``jobs.drill``): set before the destroy, so
    # the loss the watchdog finds afterwards is recorded as a drill, never as a real one.
    drilled_at = models.DateTimeField(null=True, blank=True)

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
    # The latest beat's GPUs, one object each (jobs.agent_api.api.GpuIn): index, bus id, name,
    # utilisation, memory, temperature, uncorrected ECC errors and an error where one is lost.
    gpus = models.JSONField(default=list, blank=True)
    bytes_down = models.PositiveBigIntegerField(default=0)
    bytes_up = models.PositiveBigIntegerField(default=0)
    # Everything the container moved since its agent started (the agent's own bytes, the
    # training command's downloads): Vast bills every byte, so spend counts the larger total.
    net_rx_bytes = models.PositiveBigIntegerField(default=0)
    net_tx_bytes = models.PositiveBigIntegerField(default=0)
    # The start deadline (``jobs.watchdog.start_deadline``): before the agent, when the host must
    # have one (from the image's bytes and the link, pushed by what Vast shows); after register,
    # when the early phase under way stalls if no byte of it moves. With why, in words, and what
    # it was decided on (the early phases' bytes; a pull seen on a machine taken to hold the
    # image). ``heartbeat_deadline`` is never later than it while it applies.
    start_due_at = models.DateTimeField(null=True, blank=True)
    start_due_why = models.CharField(max_length=300, blank=True)
    start_progress = models.JSONField(default=dict, blank=True)
    # The download link this host's agent measured (its early phases' bytes over their time):
    # the machine's measured link for the team's next start deadline there.
    link_mbps = models.FloatField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    pending_command = models.CharField(max_length=20, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    requested_at = models.DateTimeField(null=True, blank=True)
    # Who claimed the rent ("host:pid:start", ``jobs.renting.claims``) and when a create was sent
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
