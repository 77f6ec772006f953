"""The watchdog: one tick every few seconds (Celery beat) that notices lost hosts.

A host is lost when (DESIGN.md, "Failure detection"):
1. the provider says so: instance missing, exited, offline, unknown for two polls, or outbid
   (one paged list call per provider account, at most every ``PROVIDER_POLL_INTERVAL_S``);
2. no heartbeat for the heartbeat timeout;  3. the agent reported a GPU fault;
4. no training progress for ``stall_timeout``;  5. never registered within ``start_timeout``.

Conditions 2-5 all surface through one indexed query: every attempt stores the moment by which
it must be looked at (``heartbeat_deadline``). Renting sets it to the start timeout, each
heartbeat pushes it forward, and a heartbeat that reports a GPU fault or a stall pulls it to
now. A network blip shorter than the heartbeat timeout while the provider still says running is
therefore not a loss. Every tick is an idempotent reconciler: a duplicate tick wastes work only.

Each tick also asks the running attempts of ``checkpoint = "auto"`` jobs for the checkpoints
their Young/Daly interval calls for (``jobs.auto_checkpoint``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F

from hosts import selection
from hosts.vast import Instance, VastClient, VastError
from jobs import auto_checkpoint, lifecycle, renting, stall
from jobs.lifecycle import Loss
from jobs.models import LIVE_ATTEMPT_STATES, ON_HOST_STATES, Attempt, AttemptState, Checkpoint, Job
from nomadgpu.models import ServiceHeartbeat

logger = logging.getLogger(__name__)

WATCHDOG = "watchdog"
LOST_STATUSES = frozenset({"exited", "offline"})


def grace(seconds: float) -> timedelta:
    """A grace period from its setting (``ADOPT_AFTER_S``, ``ORPHAN_GRACE_S``, ...): all are
    environment variables, so operators, drills and tests can shorten them."""
    return timedelta(seconds=seconds)


def record_tick(*, now: datetime) -> None:
    """Mark the watchdog alive at NOW (the status page's 'is the watchdog ticking')."""
    updated = ServiceHeartbeat.objects.filter(name=WATCHDOG).update(
        last_seen_at=now, count=F("count") + 1
    )
    if not updated:
        ServiceHeartbeat.objects.get_or_create(
            name=WATCHDOG, defaults={"last_seen_at": now, "count": 1}
        )


def tick(*, now: datetime, poll_provider: bool | None = None) -> dict:
    """Run one watchdog pass at NOW and say what it did."""
    record_tick(now=now)
    if poll_provider is None:
        poll_provider = provider_poll_due(now)
    lost = [lifecycle.handle_loss(loss, now=now) for loss in find_due_losses(now)]
    moved = 0
    if poll_provider:
        lost += [lifecycle.handle_loss(loss, now=now) for loss in poll_providers(now)]
        # Contract ends only change with a poll: checked at its cadence, not every tick.
        moved = move_off_expiring_contracts(now)
    planned = [lifecycle.plan_rent(job_id, now=now) for job_id in jobs_needing_a_host(now)]
    return {
        # Jobs with `checkpoint = "auto"`: one query when there are none.
        "checkpoints_asked": auto_checkpoint.ask_due_checkpoints(now),
        "moved": moved,
        "lost": sum(bool(x) for x in lost),
        "planned": sum(p is not None for p in planned),
        "nudged": nudge_planned(now),
    }


def move_off_expiring_contracts(now: datetime) -> int:
    """Move jobs off hosts whose contract ends within ``CONTRACT_MOVE_LEAD_S``: first ask the
    agent for a checkpoint, then, once one newer than the request is ready (or half the lead is
    gone), end the attempt as a planned move (``lifecycle.move_before_contract_end``). Returns how
    many jobs were moved. A job that cannot be moved in time is stopped by the provider and
    recovers as a loss (``provider_stopped``)."""
    lead = timedelta(seconds=settings.CONTRACT_MOVE_LEAD_S)
    expiring = Attempt.objects.filter(
        state=AttemptState.RUNNING, contract_ends_at__isnull=False, contract_ends_at__lte=now + lead
    ).order_by()
    moved = 0
    for attempt in expiring:
        if attempt.move_asked_at is None:
            ask_checkpoint_before_contract_end(attempt, now=now)
        elif move_is_due(attempt, now=now, lead=lead):
            moved += lifecycle.move_before_contract_end(attempt.pk, now=now)
    return moved


def move_is_due(attempt: Attempt, *, now: datetime, lead: timedelta) -> bool:
    """A checkpoint asked for the move is ready, or waiting longer would risk the end itself."""
    if attempt.contract_ends_at - now <= lead / 2:
        return True
    return (
        Checkpoint.objects.filter(attempt=attempt, ready_at__gte=attempt.move_asked_at)
        .ready()
        .exists()
    )


def ask_checkpoint_before_contract_end(attempt: Attempt, *, now: datetime) -> None:
    """Ask ATTEMPT's agent for a checkpoint (once) and say why on the job's timeline."""
    if not Attempt.objects.filter(pk=attempt.pk, move_asked_at__isnull=True).update(
        move_asked_at=now
    ):
        return  # another tick asked first
    lifecycle.request_checkpoint(attempt.pk)
    lifecycle.record_event(
        attempt.job_id,
        now=now,
        kind="contract_expiring",
        message=f"the host's contract ends at {attempt.contract_ends_at:%Y-%m-%d %H:%M} UTC: "
        "checkpointing to move before it",
        ends_at=attempt.contract_ends_at.isoformat(),
    )


def nudge_planned(now: datetime) -> int:
    """Send the rent message again for attempts planned long ago and still unclaimed; say how
    many. The first message was lost (a broker restart, a dropped message): without this the
    planned attempt would hold the job's one live slot forever. ``renting.rent`` claims an
    attempt once, so a duplicate message is a no-op."""
    # No ordering: the model's default (by job) joined every attempt to its job for nothing.
    stale = (
        Attempt.objects.filter(
            state=AttemptState.PLANNED, created_at__lte=now - grace(settings.RENT_NUDGE_AFTER_S)
        )
        .order_by()
        .values_list("pk", flat=True)
    )
    ids = list(stale)
    for attempt_id in ids:
        logger.warning("attempt %s was never claimed; sending its rent message again", attempt_id)
        lifecycle.send_task(lifecycle.RENT_TASK, attempt_id)
    return len(ids)


def provider_poll_due(now: datetime) -> bool:
    """True when the last provider poll is older than the poll interval (claims the slot)."""
    interval = timedelta(seconds=settings.PROVIDER_POLL_INTERVAL_S)
    name = "provider-poll"
    claimed = ServiceHeartbeat.objects.filter(name=name, last_seen_at__lte=now - interval).update(
        last_seen_at=now, count=F("count") + 1
    )
    if claimed:
        return True
    _, created = ServiceHeartbeat.objects.get_or_create(name=name, defaults={"last_seen_at": now})
    return created


def find_due_losses(now: datetime) -> list[Loss]:
    """Losses among attempts whose deadline passed (one indexed query), with their causes."""
    # Ordered by the deadline, as the index is: the default order (by job) sorted every time.
    due = (
        Attempt.objects.filter(state__in=ON_HOST_STATES, heartbeat_deadline__lte=now)
        .select_related("job")
        .order_by("heartbeat_deadline", "pk")
    )
    return [loss for attempt in due if (loss := cause_of_due(attempt, now)) is not None]


def cause_of_due(attempt: Attempt, now: datetime) -> Loss | None:
    """Why a due attempt counts as lost (conditions 2-5), or None if it is not after all."""
    job = attempt.job
    if attempt.registered_at is None:
        return Loss(attempt.pk, "never_registered", never_registered_detail(attempt))
    if attempt.gpu_ok is False:
        return Loss(attempt.pk, "gpu_fault", attempt.gpu_error[:300])
    timeout = job.heartbeat_timeout
    if attempt.last_heartbeat_at is None or attempt.last_heartbeat_at + timeout <= now:
        silent = f"silent for more than {timeout.total_seconds():g} s"
        return Loss(attempt.pk, "heartbeat_timeout", silent)
    if is_stalled(attempt, now):
        return Loss(attempt.pk, "stalled", f"step {attempt.step} for {job.stall_timeout_s} s")
    return None


def never_registered_detail(attempt: Attempt) -> str:
    """Why a start timed out, in the provider's words where it gave any: an instance stuck in
    ``created`` with "OCI runtime create failed" never ran the container at all."""
    detail = f"no agent within {attempt.job.start_timeout_s:g} s"
    said = attempt.provider_status_msg.strip()
    if "OCI runtime create failed" in said:  # first: the interruption keeps 300 characters
        detail += ": the host could not start the container (OCI runtime create failed)"
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


def provider_loss(attempt: Attempt, instance: Instance | None) -> Loss | None:
    """What the provider's view of ATTEMPT's instance says (condition 1), or None if healthy."""
    if instance is None:
        return Loss(attempt.pk, "provider_gone", "instance no longer exists")
    status = instance.actual_status
    if status in LOST_STATUSES:
        return Loss(attempt.pk, f"provider_{status}", instance.status_msg or "")
    if status == "unknown" and attempt.provider_unknown_polls >= 1:
        return Loss(attempt.pk, "provider_unknown", "no host heartbeat for two polls")
    if is_outbid(instance):
        return Loss(attempt.pk, "outbid", "interruptible instance paused by a higher bid")
    if status == "stopped":  # Vast stopped it (credit, contract end): it will not train again
        return Loss(attempt.pk, "provider_stopped", instance.status_msg or "")
    return None


def is_outbid(instance: Instance) -> bool:
    """Whether Vast paused an interruptible INSTANCE for a higher bid: it then shows
    ``cur_state == intended_status == next_state == "stopped"`` (dstack's Vast backend,
    ``compute.py``, from real instances: Vast flips the intended state too)."""
    stopped = (instance.cur_state, instance.intended_status, instance.next_state)
    return bool(instance.is_bid) and stopped == ("stopped",) * 3


def outbid_choice_for(
    attempt: Attempt, instance: Instance, *, now: datetime
) -> selection.OutbidChoice:
    """``selection.outbid_choice_from_decision`` with ATTEMPT's numbers: the steps left from
    its newest checkpoint at its observed speed, the margin it bid, the machine's new floor
    and the team's interruption history."""
    job = attempt.job
    done = Checkpoint.objects.filter(job_id=job.pk).newest_ready_step() or 0
    return selection.outbid_choice_from_decision(
        attempt.decision or {},
        machine_id=attempt.machine_id,
        steps_left=max((job.total_steps or attempt.total_steps or 0) - done, 0),
        seconds_per_step=attempt.seconds_per_step,
        bid_margin=attempt.bid_margin or 0.0,
        new_min_bid=instance.min_bid,
        max_bid_dph=job.requirements.get("max_bid_dph"),
        rates=renting.preemption_rates(job.team_id, now=now),
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


def poll_providers(now: datetime) -> list[Loss]:
    """One paged list call per account: provider-confirmed losses, adoptions, orphans."""
    live = Attempt.objects.live().select_related("job__team")
    by_account: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for attempt in live:
        by_account[account_of(attempt.job.team)].append(attempt)
    default_account = account_of(None)
    by_account.setdefault(default_account, [])  # orphans are looked for on the server's account
    found: list[Loss] = []
    errors: list[str] = []
    for (url, key), attempts in by_account.items():
        try:
            with VastClient(key, url) as client:
                instances = client.list_instances()
                found += reconcile_account(client, attempts, instances, now)
        except VastError as exc:
            logger.warning("provider poll of %s failed: %s", url, exc)
            errors.append(f"{url}: {exc}")
    # The status page's "provider reachable" (it shows only ok and the time, never the error).
    ServiceHeartbeat.objects.update_or_create(
        name="provider",
        defaults={
            "last_seen_at": now,
            "detail": {"ok": not errors, "error": "; ".join(errors)[:500]},
        },
    )
    return found


def account_of(team) -> tuple[str, str]:
    url = (team.vast_url if team and team.vast_url else settings.VAST_URL).rstrip("/")
    key = team.vast_api_key if team and team.vast_api_key else settings.VAST_API_KEY
    return url, key


def reconcile_account(
    client: VastClient, attempts: list[Attempt], instances: list[Instance], now: datetime
) -> list[Loss]:
    by_id = {instance.id: instance for instance in instances}
    by_label = {instance.label: instance for instance in instances if instance.label}
    found: list[Loss] = []
    for attempt in attempts:
        if attempt.state == AttemptState.REQUESTED:
            adopt_or_close(attempt, by_label.get(attempt.label), now)
        elif attempt.state in ON_HOST_STATES and attempt.instance_id is not None:
            instance = by_id.get(attempt.instance_id)
            loss = provider_loss(attempt, instance)
            note_provider_status(attempt, instance)
            outbid = loss is not None and loss.cause == "outbid"
            if outbid and raise_bid_if_it_pays(client, attempt, instance, now=now):
                continue
            if loss is not None:
                found.append(loss)
    owned = {a.instance_id for a in attempts if a.instance_id} | {a.label for a in attempts}
    reap_orphans(client, instances, owned, now)
    return found


def note_provider_status(attempt: Attempt, instance: Instance | None) -> None:
    """Keep what the provider last said of ATTEMPT's instance: its status, how many polls in a
    row it was ``unknown``, and its message (the start timeout quotes it)."""
    status = instance.actual_status if instance else "gone"
    unknown = F("provider_unknown_polls") + 1 if status == "unknown" else 0
    Attempt.objects.filter(pk=attempt.pk).update(
        provider_status=status or "",
        provider_unknown_polls=unknown,
        provider_status_msg=((instance.status_msg or "") if instance else "")[:500],
        contract_ends_at=contract_end(instance),
    )


def contract_end(instance: Instance | None) -> datetime | None:
    """When INSTANCE's contract ends (Vast's ``end_date``), or None when the provider gives no
    usable one: an end at or before the instance's start (0, say) must not move every job."""
    if instance is None or instance.end_date is None:
        return None
    if instance.start_date is not None and instance.end_date <= instance.start_date:
        return None
    return instance.end_date if instance.end_date.year >= 2020 else None


def adopt_or_close(attempt: Attempt, instance: Instance | None, now: datetime) -> None:
    """A create whose outcome was unknown: adopt the labelled instance, or give up after grace."""
    requested = attempt.requested_at or attempt.created_at
    if now - requested < grace(settings.ADOPT_AFTER_S):
        return  # the renting worker may still be waiting for the create call
    if instance is not None:
        logger.info("adopting instance %s for %s by its label", instance.id, attempt)
        lifecycle.mark_rented(
            attempt.pk,
            fields=renting.instance_fields(instance),
            instance_id=instance.id,
            decision={"adopted": True},
            now=now,
        )
    elif now - requested >= grace(settings.REQUESTED_GRACE_S):
        renting.give_up_renting(attempt, now=now, why="instance creation never completed")


def reap_orphans(client: VastClient, instances: list[Instance], owned: set, now: datetime) -> None:
    """Destroy our labelled instances that no live attempt owns, after a grace period."""
    orphan_grace = grace(settings.ORPHAN_GRACE_S)
    for instance in instances:
        if renting.parse_label(instance.label) is None:
            continue  # not ours (or another environment's): never touched
        if instance.id in owned or instance.label in owned:
            continue
        started = instance.start_date
        if started is not None and now - started < orphan_grace:
            continue
        logger.warning("destroying orphan instance %s (%s)", instance.id, instance.label)
        try:
            client.destroy_instance(instance.id)
        except VastError as exc:
            logger.warning("could not destroy orphan %s: %s", instance.id, exc)


def jobs_needing_a_host(now: datetime) -> list[int]:
    """Jobs waiting for a host with no live attempt whose backoff has passed."""
    return list(
        Job.objects.filter(state__in=lifecycle.NEEDS_HOST)
        .exclude(attempts__state__in=LIVE_ATTEMPT_STATES)
        .exclude(next_rent_at__gt=now)
        .order_by("pk")  # oldest first; the default (-created_at) sorted every time
        .values_list("pk", flat=True)
    )
