"""The deadline causes (conditions 2-5): an attempt whose ``heartbeat_deadline`` passed, judged.

Every attempt stores the moment by which it must be looked at: renting makes it due at once,
and the first look sets it to the host's start deadline (``start_due``: the image's bytes at
the link, pushed by what Vast shows, capped by the job's start timeout); each heartbeat pushes
it forward, never past the stall deadline of an early phase (``phase_stall.phase_due``),
and a heartbeat that reports a GPU fault or a stall pulls it to now. One indexed query finds
the due ones; each is then judged, in this order: no agent by the start deadline (5), a GPU
fault (3), silence (2, through the silence rule, which holds silence the supervisor itself
caused), an early phase stalled, a training stall (4). A network blip shorter than the
heartbeat timeout while the provider still says running is therefore not a loss; an attempt
that is not lost after all gets its deadline moved to when it could be.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from hosts.vast import container_runtime_failed
from jobs.lifecycle import Loss
from jobs.models import ON_HOST_STATES, Attempt, AttemptState
from jobs.watchdog import silence, stall, start_deadline, start_due
from jobs.watchdog.outages import begin_outage, gather_evidence

START_OVERDUE = "start_overdue"  # no agent by the start deadline from bytes and the link
START_STALLED = "start_stalled"  # an early phase (code, stage, restore) moved no byte in time


def find_due_losses(now: datetime, evidence: silence.Evidence | None = None) -> list[Loss]:
    """Losses among attempts whose deadline passed (one indexed query), with their causes,
    each due at NOW (``Loss.due_at``: a heartbeat stored after this read voids it).

    Silence that the supervisor caused (its agent API down, every agent silent at once) is
    held, never a loss (``jobs.watchdog.silence``): an outage is opened for the status page,
    and each attempt's silence counts again from the moment ingest works. An attempt that is
    not lost after all is looked at again when it could be (its deadline moved there)."""
    evidence = evidence if evidence is not None else gather_evidence()
    # Ordered by the deadline, as the index is: the default order (by job) sorted every time.
    due = (
        Attempt.objects.filter(state__in=ON_HOST_STATES, heartbeat_deadline__lte=now)
        .select_related("job")
        .order_by("heartbeat_deadline", "pk")
    )
    found: list[Loss] = []
    held = False
    for attempt in due:
        judged = judge_due(attempt, now, evidence)
        if judged.loss is not None:
            # Judged on the row as read at NOW: a beat stored before the close voids it.
            found.append(replace(judged.loss, due_at=now))
        elif judged.recheck_at is not None:
            look_again_at(attempt, judged.recheck_at, now=now)
        held = held or judged.held
    if held:
        begin_outage(evidence, now=now)
    return found


@dataclass(frozen=True)
class Judged:
    """A due attempt judged: its LOSS, or when to look again (RECHECK_AT), or HELD (the
    supervisor's own silence: looked at again every tick)."""

    loss: Loss | None = None
    recheck_at: datetime | None = None
    held: bool = False


def cause_of_due(
    attempt: Attempt, now: datetime, evidence: silence.Evidence | None = None
) -> Loss | None:
    """Why a due attempt counts as lost (conditions 2-5), or None if it is not after all.
    EVIDENCE is what is known of the ingest path (``jobs.watchdog.silence``); without it, silence is
    judged on the stored beats alone."""
    return judge_due(attempt, now, evidence or silence.NO_EVIDENCE).loss


def judge_due(attempt: Attempt, now: datetime, evidence: silence.Evidence) -> Judged:
    """``cause_of_due`` with when to look again: conditions 5, 3, 2 and 4, in that order."""
    job = attempt.job
    if attempt.registered_at is None:
        return judge_start(attempt, now, evidence)
    if attempt.gpu_ok is False:  # the agent itself said so: no outage can explain it
        return Judged(Loss(attempt.pk, "gpu_fault", attempt.gpu_error[:300]))
    timeout = job.heartbeat_timeout
    verdict = silence.heartbeat_verdict(
        last_heartbeat_at=attempt.last_heartbeat_at,
        registered_at=attempt.registered_at,
        interval_s=job.heartbeat_interval_s,
        timeout=timeout,
        evidence=evidence,
        others_beating=max(evidence.beating - 1, 0),
        now=now,
    )
    if verdict.kind != silence.NOT_YET:
        silent = f"silent for more than {timeout.total_seconds():g} s"
        return judged(verdict, Loss(attempt.pk, "heartbeat_timeout", silent))
    if silence.reported_since_outage(attempt.last_heartbeat_at, evidence):
        if (stalled_early := start_due.early_stall(attempt, now=now)) is not None:
            return Judged(Loss(attempt.pk, START_STALLED, stalled_early))
        if is_stalled(attempt, now):
            stalled = f"step {attempt.step} for {job.stall_timeout_s} s"
            return Judged(Loss(attempt.pk, "stalled", stalled))
    return Judged(recheck_at=_sooner(verdict.recheck_at, early_due(attempt, now)))


def judge_start(attempt: Attempt, now: datetime, evidence: silence.Evidence) -> Judged:
    """Condition 5: a host without an agent past its start deadline (``start_due``: from the
    image's bytes and the link, pushed by what Vast shows, never later than the job's
    ``start_timeout_s``). Lost as ``start_overdue``, or as ``never_registered`` when the user's
    cap is what ran out; an outage of the agent API since the rent holds it (``silence``)."""
    due = start_due.ensure_start_due(attempt, now=now)
    if due is None:  # not rented as far as the row says: judged on the cap alone, as before
        seconds = float(attempt.job.start_timeout_s)
    else:
        seconds = (due.at - attempt.rented_at).total_seconds()
    verdict = silence.start_verdict(
        rented_at=attempt.rented_at, start_timeout_s=seconds, evidence=evidence, now=now
    )
    if due is None or due.capped:
        return judged(
            verdict, Loss(attempt.pk, "never_registered", never_registered_detail(attempt))
        )
    detail = start_deadline.overdue_detail(
        due, rented_at=attempt.rented_at, provider_status=attempt.provider_status, now=now
    )
    return judged(verdict, Loss(attempt.pk, START_OVERDUE, detail))


def early_due(attempt: Attempt, now: datetime) -> datetime | None:
    """When a registered ATTEMPT's early phase stalls, if that is still ahead of NOW."""
    due = attempt.start_due_at
    if attempt.phase != "restoring" or due is None or due <= now:
        return None
    return due


def _sooner(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return min(known) if known else None


def judged(verdict: silence.Verdict, loss: Loss) -> Judged:
    """LOSS when VERDICT says lost; otherwise when to look again, or held."""
    if verdict.kind == silence.LOST:
        return Judged(loss)
    return Judged(recheck_at=verdict.recheck_at, held=verdict.kind == silence.HOLD)


def look_again_at(attempt: Attempt, moment: datetime, *, now: datetime) -> None:
    """Move ATTEMPT's deadline to MOMENT, unless a heartbeat moved it meanwhile."""
    Attempt.objects.filter(pk=attempt.pk, heartbeat_deadline__lte=now).update(
        heartbeat_deadline=max(moment, now)
    )


def never_registered_detail(attempt: Attempt) -> str:
    """Why a start timed out, in the provider's words where it gave any: an instance stuck in
    ``created`` whose runtime failed ("OCI runtime create failed", ``container_runtime_failed``)
    never ran the container at all."""
    detail = f"no agent within {attempt.job.start_timeout_s:g} s"
    said = attempt.provider_status_msg.strip()
    if container_runtime_failed(said):  # first: the interruption keeps 300 characters
        detail += ": the host could not start the container (its container runtime failed)"
    if attempt.provider_status and said:
        detail += f"; the provider shows it {attempt.provider_status}: {said}"
    return detail


def is_stalled(attempt: Attempt, now: datetime) -> bool:
    """Whether the running ATTEMPT, as stored, is stalled (``stall.is_stalled``, the rule the
    heartbeat applies too)."""
    return attempt.state == AttemptState.RUNNING and stall.is_stalled(
        phase=attempt.phase,
        step_before=attempt.step,
        step_now=attempt.step,  # no beat is being decided on: the stored step is the latest
        last_progress_at=attempt.last_progress_at,
        running_at=attempt.running_at,
        stall_timeout_s=attempt.job.stall_timeout_s,
        now=now,
    )
