"""What a rental's end tells the team's memory of machines (``hosts.models.MachineRental``):
the record completed when an attempt ends (``note_rental_end``: ready or not, hours, outbids,
its speed and link against their promise) and, for a host loss, what went wrong and whether it
is charged to the machine (``charge_loss``). The memory's sums, posteriors and ban are
``hosts.selection.machine_memory``'s; docs/renting-and-recovery.md, "A team memory of machines".

What went wrong (``incident_kind``): before its agent registered, a host that never got there
(``never_registered``, ``start_overdue``, ``start_failed``) was **never ready**, one the
provider lost (gone, offline, exited, stopped) was **lost while loading**; after, a ``stalled``
job **stalled** and any other loss was **lost while running**. An outbid is not the machine's
doing: it is counted (outbids per rented hour), never charged.

An incident is charged only when it was not ours (``excuse``, first that holds):
- a supervisor outage (``nomadgpu.models.IngestOutage``) overlapping the attempt's silence, from
  its last heartbeat (or its rent) to the loss;
- a provider-wide outage, seen two ways: the provider's API failed at the last poll (the
  ``provider`` service heartbeat), or ``PROVIDER_WIDE_MACHINES`` machines were lost within
  ``PROVIDER_WIDE_WINDOW`` of each other (each of them excused, the earlier ones too). Vast
  publishes no outage feed; independent hosts at the prior 0.02 losses per hour almost never
  lose three within two minutes (ten live hosts: about 5e-8 per window), so that many at once is
  the provider or the network between;
- the supervisor failing on the job meanwhile: a ``supervisor_error`` event since the rent, or
  the job held in ``needs_attention``;
- the job's own error: a non-zero exit of its command (unless the host killed it).
A fire drill is never charged: ``lifecycle.handle_loss`` sends a drilled host's loss
(``Attempt.drilled_at``, ``Interruption.drill``) to ``avoid_machine`` alone, never to
``charge_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from hosts.models import Machine, MachineRental
from hosts.selection import machine_memory as mm
from jobs.models import Attempt, Checkpoint, CheckpointState, JobEvent, JobState, Racer
from jobs.rent_decision import RentDecision
from nomadgpu.models import IngestOutage, ServiceHeartbeat

# ``start_overdue``: no agent by the start deadline from bytes and the link
# (``jobs.watchdog.deadlines.START_OVERDUE``; the watchdog imports this module's callers).
NEVER_READY_CAUSES = ("never_registered", "start_overdue", "start_failed")
OUTBID = "outbid"  # lifecycle.OUTBID (lifecycle imports this module)
SUPERVISOR_ERROR = "supervisor_error"  # jobs.attention.EVENT (attention imports lifecycle)
PROVIDER = "provider"  # the poll's service heartbeat (jobs.watchdog.poll.poll_providers)
PROVIDER_WIDE_MACHINES = 3
PROVIDER_WIDE_WINDOW = timedelta(minutes=2)
# A restore shorter than this, or moving less, measures no link (the request's own latency).
LINK_MIN_BYTES = 4 * 1024**2
LINK_MIN_S = 2.0


def incident_kind(cause: str, *, ready: bool) -> str:
    """What a loss of CAUSE was, for a host whose agent had (READY) or had not registered."""
    if not ready:
        return mm.NEVER_READY if cause in NEVER_READY_CAUSES else mm.LOST_LOADING
    return mm.STALLED if cause == "stalled" else mm.LOST_RUNNING


@dataclass(frozen=True)
class LossFacts:
    """What was going on around one loss, for ``excuse``."""

    cause: str
    exit_code: int | None = None
    supervisor_outage: bool = False
    provider_failing: bool = False
    machines_lost_together: int = 1
    supervisor_error: bool = False


def excuse(facts: LossFacts) -> str:
    """Why the loss is not charged to its machine (the module docstring), or "" when it is."""
    if facts.supervisor_outage:
        return "a supervisor outage: the agent API took no heartbeats meanwhile"
    if facts.provider_failing:
        return "a provider-wide outage: the provider's API failed at the last poll"
    if facts.machines_lost_together >= PROVIDER_WIDE_MACHINES:
        minutes = PROVIDER_WIDE_WINDOW.total_seconds() / 60
        return (
            f"a provider-wide outage: {facts.machines_lost_together} machines lost "
            f"within {minutes:g} min"
        )
    if facts.supervisor_error:
        return "the supervisor failed on this job meanwhile (it needed attention)"
    if facts.exit_code not in (None, 0) and facts.cause != "killed":
        return f"the job's own error (its command exited with {facts.exit_code})"
    return ""


def note_rental_end(attempt: Attempt) -> None:
    """Complete ATTEMPT's rental record as it ended (a closed attempt: ``ended_at`` set)."""
    if attempt.machine_id is None or attempt.ended_at is None:
        return
    decision = RentDecision.of(attempt)
    MachineRental.objects.filter(attempt_id=attempt.pk).update(
        ended_at=attempt.ended_at,
        ready_at=attempt.registered_at,
        outbids=attempt.outbids + (attempt.end_reason == OUTBID),
        seconds_per_step=attempt.seconds_per_step,
        promised_seconds_per_step=decision.promised_seconds_per_step,
        down_mbps=measured_link_mbps(attempt),
        advertised_down_mbps=decision.download_mbps,
    )


def charge_loss(attempt: Attempt) -> None:
    """Record what ATTEMPT's host loss was (its ``end_reason`` is the cause, its ``ended_at``
    the moment) and why it is not charged, if it is not (``excuse``)."""
    if attempt.machine_id is None or attempt.ended_at is None:
        return
    cause, at = attempt.end_reason, attempt.ended_at
    together = machines_lost_near(attempt.machine_id, at)
    facts = LossFacts(
        cause=cause,
        exit_code=attempt.exit_code,
        supervisor_outage=outage_overlaps(attempt.last_heartbeat_at or attempt.rented_at, at),
        provider_failing=provider_failing(at),
        machines_lost_together=len(together) + 1,
        supervisor_error=supervisor_failed_on(attempt),
    )
    why = excuse(facts)
    MachineRental.objects.filter(attempt_id=attempt.pk).update(
        incident=incident_kind(cause, ready=attempt.registered_at is not None),
        cause=cause[:40],
        excused=why[:200],
    )
    if facts.machines_lost_together >= PROVIDER_WIDE_MACHINES:
        MachineRental.objects.filter(pk__in=together, excused="").update(excused=why[:200])


def note_racer_failure(racer: Racer, *, cause: str, now: datetime) -> None:
    """A hedged rent's RACER failed on its own (CAUSE) before its agent registered: a rental of
    its machine that never got ready, charged to it unless it was not its doing (``excuse``), as
    an attempt's loss is. Its race's losers are not recorded: they never had their chance."""
    if racer.machine_id is None:
        return
    attempt = racer.attempt
    offer = dict(RentDecision.of(attempt).offer_summary(racer.offer_id))
    rented_at = racer.rented_at or racer.created_at
    record = Machine.objects.note_rented(
        racer.machine_id, gpu_name=racer.gpu_name, at=rented_at, offer=offer, racer_id=racer.pk
    )
    together = machines_lost_near(racer.machine_id, now)
    facts = LossFacts(
        cause=cause,
        supervisor_outage=outage_overlaps(rented_at, now),
        provider_failing=provider_failing(now),
        machines_lost_together=len(together) + 1,
        supervisor_error=supervisor_failed_on(attempt),
    )
    why = excuse(facts)
    MachineRental.objects.filter(pk=record.pk).update(
        ended_at=now,
        incident=incident_kind(cause, ready=False),
        cause=cause[:40],
        excused=why[:200],
        advertised_down_mbps=_positive(offer.get("inet_down_mbps")),
    )
    if facts.machines_lost_together >= PROVIDER_WIDE_MACHINES:
        MachineRental.objects.filter(pk__in=together, excused="").update(excused=why[:200])


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def machines_lost_near(machine_id: int, at: datetime) -> list[int]:
    """The rental records of other machines lost within ``PROVIDER_WIDE_WINDOW`` of AT (one a
    machine)."""
    rows = (
        MachineRental.objects.exclude(incident="")
        .exclude(machine__machine_id=machine_id)
        .filter(ended_at__gte=at - PROVIDER_WIDE_WINDOW, ended_at__lte=at + PROVIDER_WIDE_WINDOW)
        .values_list("pk", "machine_id")
    )
    first_of: dict[int, int] = {}
    for pk, machine in rows:
        first_of.setdefault(machine, pk)
    return list(first_of.values())


def outage_overlaps(since: datetime | None, until: datetime) -> bool:
    """Whether an agent-API outage overlapped SINCE..UNTIL."""
    outages = IngestOutage.objects.filter(started_at__lte=until)
    if since is not None:
        outages = outages.filter(Q(ended_at=None) | Q(ended_at__gte=since))
    return outages.exists()


def provider_failing(at: datetime) -> bool:
    """Whether the provider's last poll before AT (within a few intervals) failed."""
    beat = ServiceHeartbeat.objects.filter(name=PROVIDER).first()
    if beat is None or not isinstance(beat.detail, dict):
        return False
    recent = timedelta(
        seconds=3 * (settings.PROVIDER_POLL_INTERVAL_S + settings.WATCHDOG_INTERVAL_S)
    )
    return beat.detail.get("ok") is False and abs(at - beat.last_seen_at) <= recent


def supervisor_failed_on(attempt: Attempt) -> bool:
    """Whether the supervisor failed on ATTEMPT's job since its rent, or holds it for a person."""
    if attempt.job.state == JobState.NEEDS_ATTENTION:
        return True
    since = attempt.rented_at or attempt.created_at
    errors = JobEvent.objects.filter(job_id=attempt.job_id, kind=SUPERVISOR_ERROR)
    return errors.filter(created_at__gte=since).exists()


def measured_link_mbps(attempt: Attempt) -> float | None:
    """The download Mbit/s ATTEMPT's host showed: what its agent measured on its early phases'
    bytes (``Attempt.link_mbps``, the start deadline's measure), else its checkpoint restore's
    bytes over the time from the phase before the restore to its last byte; None without
    either."""
    if attempt.link_mbps:
        return attempt.link_mbps
    done, step = attempt.restore_downloaded_at, attempt.resumed_from_step
    if done is None or not step:
        return None
    before = (
        attempt.setup_done_at,
        attempt.workdir_ready_at,
        attempt.deps_ready_at,
        attempt.container_started_at,
    )
    since = next((m for m in before if m is not None and m <= done), None)
    size = (
        Checkpoint.objects.filter(job_id=attempt.job_id, step=step, state=CheckpointState.READY)
        .values_list("size", flat=True)
        .first()
    )
    if since is None or not size:
        return None
    seconds = (done - since).total_seconds()
    if size < LINK_MIN_BYTES or seconds < LINK_MIN_S:
        return None
    return size * 8 / seconds / 1e6
