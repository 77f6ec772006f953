"""The watchdog: one tick every few seconds (Celery beat) that notices lost hosts.

A host is lost when (DESIGN.md, "Failure detection"):
1. the provider says so: instance missing, exited, offline, unknown for two polls, outbid, or
   its contract given up before the container ran (``start_failed`` when the host's runtime
   failed) (one paged list call per provider account, at most every ``PROVIDER_POLL_INTERVAL_S``);
2. no heartbeat for the heartbeat timeout;  3. the agent reported a GPU fault;
4. no training progress for ``stall_timeout``;  5. never registered within ``start_timeout``.

A running attempt whose host shows ``offline`` may instead be waited for: Vast keeps its disk
through a reboot, and ``hosts.wait_or_move`` says at each poll whether waiting is still the
cheaper way (``offline_loss_unless_waiting``, ``note_host_back``).

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
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import Count, F, Max

from hosts import selection
from hosts.models import Machine
from hosts.vast import Instance, VastClient, VastError, container_runtime_failed
from hosts.wait_or_move import ReturnHistory, WaitOrMove
from jobs import (
    attention,
    lifecycle,
    rent_claims,
    renting,
    silence,
    stall,
)
from jobs.checkpoints import requests
from jobs.lifecycle import Loss
from jobs.market_terms import RentDecision
from jobs.models import LIVE_ATTEMPT_STATES, ON_HOST_STATES, Attempt, AttemptState, Checkpoint, Job
from jobs.staging import stage
from nomadgpu import ingest
from nomadgpu.ingest import beacon_interval_s, read_ingest
from nomadgpu.ingest import gap as ingest_gap
from nomadgpu.models import IngestOutage, ServiceHeartbeat, Team

logger = logging.getLogger(__name__)

WATCHDOG = "watchdog"
LOST_STATUSES = frozenset({"exited", "offline"})
OFFLINE = "provider_offline"  # a host that may come back with its disk (``wait_or_move``)
START_FAILED = "start_failed"  # the host's container runtime could not start the container
BEFORE_RUNNING = frozenset({None, "created", "loading"})  # Vast's actual_status until running


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
    """Run one watchdog pass at NOW and say what it did. Each row (a loss, an account, a job)
    is its own unit: one that raises is logged, written once where a person sees it
    (``jobs.attention``), and the pass goes on."""
    record_tick(now=now)
    attention.begin_pass()
    if poll_provider is None:
        poll_provider = provider_poll_due(now)
    evidence = gather_evidence()
    if end_outage_if_over(evidence, now=now):
        evidence = gather_evidence()  # silence now counts from the outage's end
    lost = [handle_loss(loss, now=now) for loss in find_due_losses(now, evidence)]
    moved = 0
    if poll_provider:
        lost += [handle_loss(loss, now=now) for loss in poll_providers(now)]
        # Contract ends only change with a poll: checked at its cadence, not every tick.
        moved = move_off_expiring_contracts(now)
    settled = settle_unsent_claims(now)
    planned = [plan_rent(job_id, now=now) for job_id in jobs_needing_a_host(now)]
    report = {
        "settled": settled,
        # Jobs with `checkpoint = "auto"`: one query when there are none.
        "checkpoints_asked": requests.ask_due_checkpoints(now),
        "moved": moved,
        "lost": sum(bool(x) for x in lost),
        "planned": sum(p is not None for p in planned),
        "nudged": nudge_planned(now),
        "staging_nudged": stage.nudge_staging(now),
        "held": evidence.outage_open,
    }
    report["failed"] = attention.record_pass(now=now)
    return report


# A row whose loss could not be handled is looked at again this much later, not every tick.
FAILED_ROW_RETRY = timedelta(seconds=60)


def handle_loss(loss: Loss, *, now: datetime) -> bool:
    """``lifecycle.handle_loss`` for one row: its error stays with its job, and pushes its own
    deadline back."""
    job_id = Attempt.objects.filter(pk=loss.attempt_id).values_list("job_id", flat=True).first()
    handled = attention.guarded(
        lifecycle.handle_loss, loss, now=now, job_id=job_id, what="handle its host's loss"
    )
    if handled is None:
        Attempt.objects.filter(pk=loss.attempt_id, heartbeat_deadline__lte=now).update(
            heartbeat_deadline=now + FAILED_ROW_RETRY
        )
    return bool(handled)


def plan_rent(job_id: int, *, now: datetime) -> Attempt | None:
    """``lifecycle.plan_rent`` for one job, unless its stored spec no longer validates (then
    it is held for attention); its error stays with it."""
    return attention.guarded(
        plan_valid_rent, job_id, now=now, job_id=job_id, what="plan its next rent"
    )


def plan_valid_rent(job_id: int, *, now: datetime) -> Attempt | None:
    job = Job.objects.get(pk=job_id)
    if attention.hold_if_spec_invalid(job, now=now):
        return None
    return lifecycle.plan_rent(job_id, now=now)


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
        moved += bool(
            attention.guarded(
                move_off_contract,
                attempt,
                now=now,
                lead=lead,
                job_id=attempt.job_id,
                what="move it off a host whose contract ends",
            )
        )
    return moved


def move_off_contract(attempt: Attempt, *, now: datetime, lead: timedelta) -> bool:
    """One step of moving ATTEMPT off its expiring contract; True when it moved."""
    if attempt.move_asked_at is None:
        ask_checkpoint_before_contract_end(attempt, now=now)
        return False
    return move_is_due(attempt, now=now, lead=lead) and lifecycle.move_before_contract_end(
        attempt.pk, now=now
    )


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
        try:
            lifecycle.send_task(lifecycle.RENT_TASK, attempt_id)
        except Exception:  # the broker: every nudge would fail alike; the next tick retries
            logger.exception("could not send the rent message of attempt %s again", attempt_id)
            break
    return len(ids)


def settle_unsent_claims(now: datetime) -> int:
    """Claims of rents whose process died before a create was sent: nothing can exist at Vast,
    so each is settled at once, without a provider call, and its job is planned again in this
    same pass (``rent_claims``). Claims with a create sent wait for the provider poll, which
    adopts by label. Says how many were settled."""
    claimed = Attempt.objects.filter(state=AttemptState.REQUESTED, create_sent_at=None).order_by()
    settled = 0
    for attempt in claimed:
        if rent_claims.claim_is_dead(attempt, now=now):
            outcome = attention.guarded(
                renting.settle_dead_claim,
                attempt,
                None,
                now=now,
                job_id=attempt.job_id,
                what="settle the rent its dead worker left",
            )
            settled += outcome == "settled"
    return settled


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


def find_due_losses(now: datetime, evidence: silence.Evidence | None = None) -> list[Loss]:
    """Losses among attempts whose deadline passed (one indexed query), with their causes.

    Silence that the supervisor caused (its agent API down, every agent silent at once) is
    held, never a loss (``jobs.silence``): an outage is opened for the status page, and each
    attempt's silence counts again from the moment ingest works. An attempt that is not lost
    after all is looked at again when it could be (its deadline moved there)."""
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
            found.append(judged.loss)
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
    EVIDENCE is what is known of the ingest path (``jobs.silence``); without it, silence is
    judged on the stored beats alone."""
    return judge_due(attempt, now, evidence or silence.NO_EVIDENCE).loss


def judge_due(attempt: Attempt, now: datetime, evidence: silence.Evidence) -> Judged:
    """``cause_of_due`` with when to look again: conditions 5, 3, 2 and 4, in that order."""
    job = attempt.job
    if attempt.registered_at is None:
        verdict = silence.start_verdict(
            rented_at=attempt.rented_at,
            start_timeout_s=job.start_timeout_s,
            evidence=evidence,
            now=now,
        )
        loss = Loss(attempt.pk, "never_registered", never_registered_detail(attempt))
        return judged(verdict, loss)
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
    if silence.reported_since_outage(attempt.last_heartbeat_at, evidence) and is_stalled(
        attempt, now
    ):
        return Judged(
            Loss(attempt.pk, "stalled", f"step {attempt.step} for {job.stall_timeout_s} s")
        )
    return Judged(recheck_at=verdict.recheck_at)


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


def gather_evidence() -> silence.Evidence:
    """What this tick knows of the ingest path: the web's beacon and outages
    (``nomadgpu.ingest``) and the newest beat stored for any live attempt (one query)."""
    ingest = read_ingest()
    beating = Attempt.objects.filter(state__in=ON_HOST_STATES, registered_at__isnull=False)
    seen = beating.order_by().aggregate(last=Max("last_heartbeat_at"), n=Count("id"))
    return silence.Evidence(
        web_seen_at=ingest.web_seen_at,
        last_beat_at=seen["last"],
        beating=seen["n"],
        resumed_at=ingest.resumed_at,
        outage_open=ingest.open is not None,
        open_cause=ingest.open.cause if ingest.open else "",
        open_since=ingest.open.started_at if ingest.open else None,
        web_gap=ingest_gap() if beacon_interval_s() > 0 else None,
    )


def begin_outage(evidence: silence.Evidence, *, now: datetime) -> None:
    """Losses were held: record the outage (once) for the status page, with its cause: the
    web's beacon stopped, or the web is up and no agent gets through."""
    if evidence.outage_open:
        return
    web_down = evidence.web_seen_at is not None and now - evidence.web_seen_at > ingest.gap()
    if web_down:
        ingest.begin_outage(cause=IngestOutage.WEB_DOWN, started_at=evidence.web_seen_at)
    else:
        # The last moment ingest was known to work: a beat, the beacon, or the end of the
        # outage before this one (agents still reconnecting after it must not back-date this
        # one into it).
        known = [m for m in (evidence.last_beat_at, evidence.resumed_at) if m is not None]
        started = max(known) if known else evidence.web_seen_at or now
        ingest.begin_outage(cause=IngestOutage.AGENTS_SILENT, started_at=started)


def end_outage_if_over(evidence: silence.Evidence, *, now: datetime) -> bool:
    """Close the open outage once ingest is seen working again after it began: a beat stored
    after it, the web's beacon again (its own write closes it too, after a longer gap), or no
    agent left to hear from. True when this call closed it."""
    if not evidence.outage_open:
        return False
    since = evidence.open_since
    beat_after = evidence.last_beat_at is not None and evidence.last_beat_at > since
    if evidence.open_cause == IngestOutage.WEB_DOWN:
        over = (evidence.web_seen_at is not None and evidence.web_seen_at > since) or (
            evidence.last_beat_at is not None and evidence.last_beat_at > since + ingest.gap()
        )
    else:
        over = beat_after or evidence.beating == 0
    if over:
        ingest.end_outage(now=now, cause=evidence.open_cause, started_at=since)
    return over


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


def provider_loss(attempt: Attempt, instance: Instance | None) -> Loss | None:
    """What the provider's view of ATTEMPT's instance says (condition 1), or None if healthy."""
    if instance is None:
        return Loss(attempt.pk, "provider_gone", "instance no longer exists")
    status = instance.actual_status
    if status in LOST_STATUSES:
        return Loss(attempt.pk, f"provider_{status}", instance.status_msg or "")
    if status == "unknown" and attempt.provider_unknown_polls >= 1:
        return Loss(attempt.pk, "provider_unknown", "no host heartbeat for two polls")
    if all_stopped(instance) and container_runtime_failed(instance.status_msg):
        why = f"the host could not start the container: {instance.status_msg}"
        return Loss(attempt.pk, START_FAILED, why)
    if is_outbid(instance):
        return Loss(attempt.pk, "outbid", "interruptible instance paused by a higher bid")
    if gave_up_before_running(instance):
        why = f"Vast stopped the contract before the container ran ({status or 'provisioning'})"
        said = f": {instance.status_msg}" if instance.status_msg else ""
        return Loss(attempt.pk, "provider_stopped", why + said)
    if status == "stopped":  # Vast stopped it (credit, contract end): it will not train again
        return Loss(attempt.pk, "provider_stopped", instance.status_msg or "")
    return None


def all_stopped(instance: Instance) -> bool:
    """Whether Vast has given INSTANCE's contract up: ``cur_state``, ``intended_status`` and
    ``next_state`` all ``"stopped"`` (dstack's Vast backend, ``compute.py``, reads exactly this
    as lost: "can happen, among other cases, when a spot instance is outbid"). ``cur_state``
    alone is not enough: a healthy instance shows it ``stopped`` while its image loads."""
    return (instance.cur_state, instance.intended_status, instance.next_state) == ("stopped",) * 3


def gave_up_before_running(instance: Instance) -> bool:
    """Whether Vast gave the contract up while ``actual_status`` still says ``created`` or
    ``loading`` (recorded instance bodies show both: a host that could not create the
    container, a bid outbid while its image loaded): nothing will start it, so waiting out the
    start timeout only bills storage."""
    return all_stopped(instance) and instance.actual_status in BEFORE_RUNNING


def is_outbid(instance: Instance) -> bool:
    """Whether Vast paused an interruptible INSTANCE for a higher bid (``all_stopped``; Vast
    flips the intended state too), before or after it ran. Not when its ``status_msg`` says the
    container runtime failed: that host cannot run the container at any bid."""
    return (
        bool(instance.is_bid)
        and all_stopped(instance)
        and not container_runtime_failed(instance.status_msg)
    )


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
    """One paged list call per account: provider-confirmed losses, adoptions, orphans. An
    account that cannot be polled (its key no longer opens, Vast refuses it) is a
    supervisor-health line; the other accounts are polled all the same."""
    found: list[Loss] = []
    errors: list[str] = []
    for (url, key), attempts in attempts_by_account(errors).items():
        try:
            with VastClient(key, url) as client:
                instances = client.list_instances()
                found += reconcile_account(client, attempts, instances, now)
        except VastError as exc:
            logger.warning("provider poll of %s failed: %s", url, exc)
            errors.append(f"{url}: {exc}")
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            logger.exception("provider poll of %s failed", url)
            errors.append(f"{url}: {attention.describe(exc)}")
            attention.account_failed(url, attention.describe(exc))
    # The status page's "provider reachable" (it shows only ok and the time, never the error).
    ServiceHeartbeat.objects.update_or_create(
        name="provider",
        defaults={
            "last_seen_at": now,
            "detail": {"ok": not errors, "error": "; ".join(errors)[:500]},
        },
    )
    return found


def attempts_by_account(errors: list[str]) -> dict[tuple[str, str], list[Attempt]]:
    """The live attempts grouped by the provider account they rent on; a team whose account
    cannot be read (a Vast key sealed under a key no longer configured) is left out, and
    said so in ERRORS once per team."""
    # The teams' secrets are opened one team at a time, inside its own try: one that does not
    # open (it is decrypted as its row loads) must not fail the query for every team.
    secrets = [f"job__team__{name}" for name in Team.SECRET_FIELDS]
    live = Attempt.objects.live().select_related("job__team").defer(*secrets)
    by_team: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in live:
        by_team[attempt.job.team_id].append(attempt)
    by_account: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    by_account[account_of(None)] = []  # orphans are looked for on the server's account
    for attempts in by_team.values():
        team = attempts[0].job.team
        try:
            account = account_of(team)
        except Exception as exc:
            why = f"team {team.slug}: its Vast account cannot be used ({attention.describe(exc)})"
            logger.error("provider poll: %s", why)
            errors.append(why)
            attention.account_failed(f"team {team.slug}", why)
            continue
        by_account[account].extend(attempts)
    return by_account


def account_of(team) -> tuple[str, str]:
    url = (team.vast_url if team and team.vast_url else settings.VAST_URL).rstrip("/")
    key = team.vast_api_key if team and team.vast_api_key else settings.VAST_API_KEY
    return url, key


def reconcile_account(
    client: VastClient, attempts: list[Attempt], instances: list[Instance], now: datetime
) -> list[Loss]:
    """What one account's instance list says of its live attempts (each attempt its own unit:
    its error stays with its job), then its orphans reaped."""
    by_id = {instance.id: instance for instance in instances}
    by_label = {instance.label: instance for instance in instances if instance.label}
    found: list[Loss] = []
    for attempt in attempts:
        loss = attention.guarded(
            reconcile_attempt,
            client,
            attempt,
            by_id,
            by_label,
            now=now,
            job_id=attempt.job_id,
            what="read what the provider says of its host",
        )
        if loss is not None:
            found.append(loss)
    owned = {a.instance_id for a in attempts if a.instance_id} | {a.label for a in attempts}
    reap_orphans(client, instances, owned, now)
    return found


def reconcile_attempt(
    client: VastClient, attempt: Attempt, by_id: dict, by_label: dict, *, now: datetime
) -> Loss | None:
    """ATTEMPT against the provider's view: a create to adopt or settle, or its host's loss."""
    if attempt.state == AttemptState.REQUESTED:
        adopt_or_close(attempt, by_label.get(attempt.label), now)
        return None
    if attempt.state not in ON_HOST_STATES or attempt.instance_id is None:
        return None
    instance = by_id.get(attempt.instance_id)
    loss = provider_loss(attempt, instance)
    note_provider_status(attempt, instance)
    if loss is not None and loss.cause == OFFLINE:
        return offline_loss_unless_waiting(attempt, loss, now=now)
    if attempt.offline_since is not None and instance is not None:
        note_host_back(attempt, now=now)
    outbid = loss is not None and loss.cause == "outbid"
    if outbid and raise_bid_if_it_pays(client, attempt, instance, now=now):
        return None
    return loss


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
        rates=renting.preemption_rates(attempt.job.team_id, now=now),
    )


def offline_loss_unless_waiting(attempt: Attempt, loss: Loss, *, now: datetime) -> Loss | None:
    """A running ATTEMPT's host is offline: None while waiting for it is expected to be
    cheaper than moving (``hosts.wait_or_move``, decided again at every poll with the odds
    as they now stand, and never past ``HOST_RETURN_CAP_S``), else LOSS, dated from when it
    went offline. The choice and its numbers go on the job's timeline when it is first made
    and when it turns to moving. A host offline before the agent ran moves at once: nothing
    is on its disk yet that a restart would save."""
    if attempt.state != AttemptState.RUNNING:
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
        offline_since=now, heartbeat_deadline=now + grace(choice.deadline_s) + polls
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
    """A create whose outcome was unknown: adopt the labelled instance, or give up after grace.
    A claim whose renting process died is settled at once (``rent_claims``)."""
    if rent_claims.claim_is_dead(attempt, now=now):
        renting.settle_dead_claim(attempt, instance, now=now)
        return
    requested = attempt.requested_at or attempt.created_at
    if now - requested < grace(settings.ADOPT_AFTER_S):
        return  # the renting worker may still be waiting for the create call
    if instance is not None:
        renting.adopt(attempt, instance, now=now)
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
        .exclude(stage_state=lifecycle.STAGING)
        .exclude(attempts__state__in=LIVE_ATTEMPT_STATES)
        .exclude(next_rent_at__gt=now)
        .order_by("pk")  # oldest first; the default (-created_at) sorted every time
        .values_list("pk", flat=True)
    )
