"""An interruptible rental outbid: raise the bid and stay on the machine, or move
(``RentDecision.outbid_choice`` weighs the two)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import F

from hosts import selection
from hosts.vast import Instance, VastClient, VastError
from jobs import lifecycle
from jobs.models import Attempt, Checkpoint
from jobs.rent_decision import RentDecision
from jobs.renting import interruption_rates

logger = logging.getLogger(__name__)


def outbid_choice_for(
    attempt: Attempt, instance: Instance, *, now: datetime
) -> selection.OutbidChoice:
    """``RentDecision.outbid_choice`` with ATTEMPT's numbers: the steps left from
    its newest checkpoint at its observed speed, the margin it bid, the machine's new floor
    and the team's interruption history."""
    job = attempt.job
    done = Checkpoint.objects.filter(job_id=job.pk).newest_ready_step() or 0
    return RentDecision.of(attempt).outbid_choice(
        machine_id=attempt.machine_id,
        steps_left=max((job.total_steps or attempt.total_steps or 0) - done, 0),
        seconds_per_step=attempt.seconds_per_step,
        bid_margin=attempt.bid_margin or 0.0,
        new_min_bid=instance.min_bid,
        max_bid_dph=job.requirements.get("max_bid_dph"),
        rates=interruption_rates.preemption_rates(job.team_id, now=now),
    )


def raise_bid_if_it_pays(
    client: VastClient, attempt: Attempt, instance: Instance, *, now: datetime
) -> bool:
    """An outbid ATTEMPT waits for its machine with a higher bid when the expected cost says it
    pays (``outbid_choice_for``): the bid is raised, the container restarts on the same host
    (the agent registers again and resumes from the newest checkpoint) and the attempt gets
    its start timeout again. Otherwise, or when Vast refuses the new bid, False: the caller
    handles it as a loss and the job moves. One contract either way: the attempt is the same
    instance, or it is destroyed before a replacement is rented."""
    choice = outbid_choice_for(attempt, instance, now=now)
    if choice.raise_to is None:
        lifecycle.record_event(attempt.job_id, now=now, kind="outbid", message=choice.why)
        return False
    try:
        client.change_bid(instance.id, choice.raise_to)
    except VastError as exc:
        logger.warning("raising the bid of %s failed (%s): moving the job", attempt, exc)
        return False
    start_deadline = now + timedelta(seconds=attempt.job.start_timeout_s)
    Attempt.objects.filter(pk=attempt.pk).update(
        dph_base=choice.raise_to, heartbeat_deadline=start_deadline, outbids=F("outbids") + 1
    )
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="bid_raised",
        message=f"outbid on instance {instance.id}: {choice.why}",
        instance_id=instance.id,
        bid_usd_per_hour=choice.raise_to,
    )
    return True
