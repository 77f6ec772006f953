"""A running attempt's host shows ``offline``: wait for it or move.

Vast keeps its disk through a reboot, and ``hosts.wait_or_move`` says at each poll whether
waiting is still the cheaper way, with the machine's return history; a host that comes back is
noted, and its agent resumes from the checkpoint it holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F

from hosts.models import Machine
from hosts.wait_or_move import ReturnHistory, WaitOrMove
from jobs import lifecycle
from jobs.lifecycle import Loss
from jobs.models import Attempt, AttemptState
from jobs.rent_decision import RentDecision
from jobs.renting import interruption_rates


def wait_choice_for(attempt: Attempt, *, offline_s: float, now: datetime) -> WaitOrMove:
    """``RentDecision.wait_or_move`` with ATTEMPT's numbers: its machine's offline history,
    the cap, its GPU $/h and the team's interruption rates."""
    machine = Machine.objects.filter(machine_id=attempt.machine_id).first()
    return RentDecision.of(attempt).wait_or_move(
        machine_id=attempt.machine_id,
        offline_s=offline_s,
        cap_s=settings.HOST_RETURN_CAP_S,
        history=machine.return_history if machine else ReturnHistory(),
        usd_per_hour=attempt.dph_base or 0.0,
        rates=interruption_rates.preemption_rates(attempt.job.team_id, now=now),
    )


def offline_loss_unless_waiting(attempt: Attempt, loss: Loss, *, now: datetime) -> Loss | None:
    """A running ATTEMPT's host is offline: None while waiting for it is expected to be
    cheaper than moving (``hosts.wait_or_move``, decided again at every poll with the odds
    as they now stand, and never past ``HOST_RETURN_CAP_S``), else LOSS, dated from when it
    went offline. The choice and its numbers go on the job's timeline when it is first made
    and when it turns to moving. A host offline before the agent ran moves at once: nothing
    is on its disk yet that a restart would save; so does one a fire drill destroyed (it will
    not come back, and its machine's return history must not count it)."""
    if attempt.state != AttemptState.RUNNING or attempt.drilled_at is not None:
        return loss
    since = attempt.offline_since or now
    choice = wait_choice_for(attempt, offline_s=(now - since).total_seconds(), now=now)
    first = attempt.offline_since is None
    if choice.wait:
        if first:
            start_waiting(attempt, choice, now=now)
        return None
    kind = "host_offline" if first else "host_offline_move"
    message = f"host offline on instance {attempt.instance_id}: {choice.why}"
    lifecycle.record_event(attempt.job_id, now=now, kind=kind, message=message, **choice.as_dict())
    if not first:
        Machine.objects.filter(machine_id=attempt.machine_id).update(
            offline_never=F("offline_never") + 1
        )
        waited = f"; did not come back within {(now - since).total_seconds():.0f} s"
        return Loss(loss.attempt_id, loss.cause, (loss.detail + waited).lstrip("; "), since)
    return loss


def start_waiting(attempt: Attempt, choice: WaitOrMove, *, now: datetime) -> None:
    """Wait for ATTEMPT's offline host: from NOW, with the heartbeat rule held off until the
    deadline has passed by two polls (the poll, not silence, decides while the provider
    says offline)."""
    polls = timedelta(seconds=2 * settings.PROVIDER_POLL_INTERVAL_S)
    if not Attempt.objects.filter(pk=attempt.pk, offline_since__isnull=True).update(
        offline_since=now, heartbeat_deadline=now + timedelta(seconds=choice.deadline_s) + polls
    ):
        return  # another poll started waiting first
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="host_offline",
        message=f"host offline on instance {attempt.instance_id}: {choice.why}",
        **choice.as_dict(),
    )


def note_host_back(attempt: Attempt, *, now: datetime) -> None:
    """ATTEMPT's host no longer shows offline. Once its agent has been heard again (the
    container restarted on the same disk, the agent registered with the same token and
    resumed from the checkpoint it holds), the wait is over: the job page says after how
    long, and the machine's history counts a return. Until then, the agent gets its start
    timeout to come back."""
    since = attempt.offline_since
    if attempt.last_heartbeat_at is None or attempt.last_heartbeat_at <= since:
        if attempt.provider_status == "offline":  # the first poll that sees it back
            Attempt.objects.filter(pk=attempt.pk).update(
                heartbeat_deadline=now + timedelta(seconds=attempt.job.start_timeout_s)
            )
        return
    back_s = (attempt.last_heartbeat_at - since).total_seconds()
    if not Attempt.objects.filter(pk=attempt.pk, offline_since=since).update(
        offline_since=None, offline_s=F("offline_s") + back_s
    ):
        return  # another tick saw it first
    Machine.objects.filter(machine_id=attempt.machine_id).update(
        offline_returns=F("offline_returns") + 1, offline_return_s=F("offline_return_s") + back_s
    )
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="host_back",
        message=f"host came back after {back_s:.0f} s; resumed on the same machine "
        f"(instance {attempt.instance_id})",
        offline_s=round(back_s, 1),
        instance_id=attempt.instance_id,
    )
