"""The job state machine: every transition is one function here, and only here. (One file
over 500 lines on purpose: the whole state machine, each transition with its guard, reads in
one place.)

Each claims the job row with a guarded update (``filter(pk=, state__in=allowed).update(...)``,
exactly one row or the transition is refused), writes a ``JobEvent``, and defers side effects
(provider calls, renting) with ``transaction.on_commit`` so nothing happens for a transaction
that rolled back. Illegal transitions raise ``IllegalTransition``; they are never ignored.

    queued → renting → starting → running → (recovering → renting …)
           → succeeded | failed | cancelled | paused_budget | needs_attention

Who moves a job, and when:
- submit (``submit_job``) and resume (``resume_job``) queue it and plan its first rent;
- ``plan_rent`` commits the next attempt (renting), asked by submit, resume and the watchdog for
  every job that needs a host (a lost one's too); ``mark_rented`` records the instance;
- the agent's heartbeats report training (``mark_running``, then ``mark_training_again`` at the
  first step after a loss) and the command's end, or its
  setup's failure (``handle_exit``); the watchdog and the agent API report a lost host
  (``handle_loss``: the job recovers; the watchdog plans the replacement in the same pass
  that found the loss, or in its next pass when the agent API reported it), a contract about
  to end (``move_before_contract_end``);
- a job whose stored spec no longer validates (JSON edited by hand) stops renting and waits
  for a person (``hold_for_attention``; ``jobs.attention`` decides, before each rent is
  planned and when a rent meets it); fixing it in the admin queues it again
  (``requeue_after_fix``);
- people cancel (``cancel_job``); spending limits pause (``pause_for_budget``): billing's budget
  pass (``billing.enforce.budget_pass``) calls it, with ``record_event`` and
  ``request_checkpoint``, and so does a rent the budget refuses while recovering
  (``jobs.spending`` verdicts, asked at submit, rent and resume).

Tasks are sent by name after commit (``enqueue``): this module never imports ``jobs.tasks``,
which imports it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from celery import current_app
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, F, Max, Q, Value
from django.db.models.functions import Greatest

from hosts.models import Machine
from jobs import machine_incidents, racers, recovery_times, spending
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    ON_HOST_STATES,
    TERMINAL_STATES,
    Attempt,
    AttemptState,
    Checkpoint,
    CheckpointState,
    Interruption,
    Job,
    JobEvent,
    JobState,
    OfferClaim,
    label_for,
)
from jobs.rent_decision import RentDecision
from jobs.spending import BudgetExceeded
from nomadgpu.crypto import new_data_key
from nomadgpu.humanize import duration, instance_price

logger = logging.getLogger(__name__)

S = JobState
ALLOWED_FROM: dict[str, frozenset[str]] = {
    S.RENTING: frozenset({S.QUEUED, S.RECOVERING, S.RENTING}),
    S.STARTING: frozenset({S.RENTING}),
    S.RUNNING: frozenset({S.STARTING}),
    S.RECOVERING: frozenset({S.STARTING, S.RUNNING}),
    S.SUCCEEDED: frozenset({S.STARTING, S.RUNNING}),
    S.FAILED: frozenset({S.QUEUED, S.RENTING, S.STARTING, S.RUNNING, S.RECOVERING}),
    S.CANCELLED: frozenset(
        {
            S.QUEUED,
            S.RENTING,
            S.STARTING,
            S.RUNNING,
            S.RECOVERING,
            S.PAUSED_BUDGET,
            S.NEEDS_ATTENTION,
        }
    ),
    S.PAUSED_BUDGET: frozenset({S.QUEUED, S.RENTING, S.STARTING, S.RUNNING, S.RECOVERING}),
    S.QUEUED: frozenset({S.PAUSED_BUDGET, S.NEEDS_ATTENTION}),
    # Only a job waiting for a host is held: one on a host trains on what it was rented with.
    S.NEEDS_ATTENTION: frozenset({S.QUEUED, S.RENTING, S.RECOVERING}),
}

OUTBID = "outbid"  # the loss cause of an interruptible instance paused by a higher bid
RENT_TASK = "jobs.tasks.rent_attempt"
STAGE_TASK = "jobs.tasks.stage_job"
STAGING = "staging"  # Job.stage_state while its entries are mirrored (jobs.staging)
DESTROY_TASK = "jobs.tasks.destroy_instance"
DESTROY_RACER_TASK = "jobs.tasks.destroy_racer"  # a hedged rent's racer out of its race
DISCARD_UPLOADS_TASK = "jobs.tasks.discard_unfinished_uploads"


class IllegalTransition(Exception):
    """The job is not in a state from which this transition is allowed."""

    def __init__(self, job_id: int, to: str, current: str | None) -> None:
        self.job_id, self.to, self.current = job_id, to, current
        super().__init__(f"job {job_id} cannot go to {to} from {current or 'nowhere'}")


@dataclass(frozen=True)
class Loss:
    """An attempt whose host is lost, and why (the cause names one of the loss conditions)."""

    attempt_id: int
    cause: str
    detail: str = ""
    # When the loss began, if before it was acted on: a host waited for while offline
    # (``hosts.wait_or_move``) was lost from the moment it went offline.
    since: datetime | None = None
    # The watchdog pass that judged a deadline cause (silence, no agent by the start
    # deadline, a stall, a GPU fault) judged rows it read at this moment. A heartbeat stored
    # after that read moved the attempt's deadline past it: the loss is then void, never
    # closed (``close_attempt``'s guard), and the next pass judges the new row.
    due_at: datetime | None = None


# --- The machinery ---------------------------------------------------------------------------


def transition(
    job_id: int,
    to: str,
    *,
    now: datetime,
    kind: str,
    message: str = "",
    data: dict | None = None,
    **fields,
) -> JobEvent:
    """Move JOB_ID to TO if its current state allows it; record why; return the event.

    Must run inside a transaction (the caller's), so the state, the event and any deferred
    side effects commit together.
    """
    claimed = Job.objects.filter(pk=job_id, state__in=ALLOWED_FROM[to]).update(
        state=to, updated_at=now, **fields
    )
    if claimed != 1:
        current = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
        raise IllegalTransition(job_id, to, current)
    return JobEvent.objects.record(job_id, now=now, kind=kind, message=message, data=data)


def record_event(job_id: int, *, now: datetime, kind: str, message: str = "", **data) -> JobEvent:
    """An event that does not change state (no offers, budget warning, checkpoint ready)."""
    return JobEvent.objects.record(job_id, now=now, kind=kind, message=message, data=data)


def is_terminal(state: str) -> bool:
    """The job has ended for good (succeeded, failed or cancelled)."""
    return state in TERMINAL_STATES


def after_commit(func, *args, **kwargs) -> None:
    """Run FUNC once the current transaction commits (side effects never precede the state)."""
    transaction.on_commit(partial(func, *args, **kwargs))


def enqueue(task_name: str, *args) -> None:
    """Send the Celery task TASK_NAME with ARGS once the current transaction commits. Robust:
    a broker that is down must not undo the commit; the watchdog's nudges and the orphan reaper
    pick up what a lost message leaves behind."""
    transaction.on_commit(partial(send_task, task_name, *args), robust=True)


def send_task(task_name: str, *args) -> None:
    """Send the Celery task TASK_NAME with ARGS now (outside a transaction)."""
    current_app.send_task(task_name, args=args)


def request_checkpoint(attempt_id: int) -> bool:
    """Have ATTEMPT_ID's next heartbeat answer ``checkpoint_now``; a pending ``stop`` (a fenced
    agent) is never replaced by it. True when this call set it (nothing was pending)."""
    return bool(
        Attempt.objects.filter(pk=attempt_id, pending_command="").update(
            pending_command="checkpoint_now"
        )
    )


# --- Submit, rent, rented ----------------------------------------------------------------------


def submit_job(*, team, created_by, now: datetime, **fields) -> Job:
    """Create a queued job and plan its rent after commit (the watchdog would find it too).

    Raises ``BudgetExceeded`` (nothing created) when the spending gate refuses it: the job's
    estimated cost would cross a limit and the submitter did not ask to wait for the budget.
    A job that encrypts its checkpoints gets its data key here."""
    with transaction.atomic():
        job = Job.objects.create(
            team=team, created_by=created_by, state=S.QUEUED, created_at=now, **fields
        )
        if job.encrypt_checkpoints and not job.data_key:
            job.data_key = new_data_key()
            job.save(update_fields=["data_key"])
        verdict = spending.gate().admit(job, now=now)
        if not verdict.allowed:
            raise BudgetExceeded(verdict.reason)
        record_event(job.pk, now=now, kind="submitted", message=f"submitted by {created_by}")
        if job.stage:
            # Mirrored and checked first (jobs.staging): no host is rented before that ends.
            Job.objects.filter(pk=job.pk).update(stage_state=STAGING)
            job.stage_state = STAGING
            enqueue(STAGE_TASK, job.pk)
        else:
            after_commit(plan_rent, job.pk, now=now)
    return job


def plan_rent(job_id: int, *, now: datetime) -> Attempt | None:
    """Commit the next attempt row for a job that needs a host (the job is then renting) and
    send the rent task; None when none is needed, another worker planned it, or the spending
    gate refuses (the job then waits, or is paused while recovering)."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .needs_host()
            .filter(pk=job_id)
            .exclude(stage_state=STAGING)  # the planner waits for the job's staged weights
            .first()
        )
        if job is None or (job.next_rent_at and job.next_rent_at > now):
            return None
        if job.attempts.live().exists():
            return None
        verdict = spending.gate().reserve(job, now=now)
        if not verdict.allowed:
            _refused_rent(job, verdict, now=now)
            return None
        number = (job.attempts.aggregate(n=Max("number"))["n"] or 0) + 1
        try:
            with transaction.atomic():
                attempt = Attempt.objects.create(
                    job=job, number=number, label=label_for(job, number), created_at=now
                )
        except IntegrityError:
            return None  # another worker planned this job's attempt first
        if job.state != S.RENTING:
            transition(job.pk, S.RENTING, now=now, kind="renting")
        enqueue(RENT_TASK, attempt.pk)
    return attempt


def _refused_rent(job: Job, verdict: spending.Verdict, *, now: datetime) -> None:
    """A rent the budget refuses: a job that lost its host and no longer fits is paused (it
    shows as paused_budget and an admin resumes it after raising the limit, or in a new
    period); any other waits and asks again after the verdict's RETRY_AFTER_S."""
    if verdict.pause:
        message = f"paused while recovering: {verdict.reason}"  # the page says what to do
        pause_for_budget(job.pk, message=message, data={"blocker": verdict.reason}, now=now)
        return
    Job.objects.filter(pk=job.pk).update(
        next_rent_at=now + timedelta(seconds=verdict.retry_after_s)
    )
    last = job.events.filter(kind__in=["budget_wait", "rented", "renting"]).order_by("-id").first()
    if last is None or last.kind != "budget_wait":
        record_event(job.pk, now=now, kind="budget_wait", message=f"waiting: {verdict.reason}")


def mark_rented(
    attempt_id: int,
    *,
    fields: dict,
    instance_id: int | None,
    decision: dict,
    now: datetime,
    message: str = "",
) -> bool:
    """Store the created (or adopted) instance on the attempt; move the job to starting. False
    when the attempt was closed meanwhile (cancelled): the instance is destroyed after commit.

    A hedged rent opens its race here with no INSTANCE_ID (``jobs.renting.race``): the attempt
    is starting with its racers' instances, and the winner's becomes its own at its agent's
    register. MESSAGE then says what is racing."""
    with transaction.atomic():
        claimed = Attempt.objects.filter(pk=attempt_id, state=AttemptState.REQUESTED).update(
            state=AttemptState.STARTING,
            instance_id=instance_id,
            rented_at=now,
            decision=decision,
            **fields,
        )
        attempt = Attempt.objects.select_related("job").get(pk=attempt_id)
        if not claimed:
            if instance_id is not None:
                enqueue(DESTROY_TASK, attempt.job.team_id, instance_id)
            return False
        # Due at once: the watchdog's next look sets the start deadline from the image's bytes
        # and the link (jobs.watchdog.start_due), never later than the job's start timeout.
        Attempt.objects.filter(pk=attempt_id).update(heartbeat_deadline=now)
        Job.objects.filter(pk=attempt.job_id).update(next_rent_at=None, rent_backoff_s=0)
        Interruption.objects.filter(job_id=attempt.job_id, replacement_rented_at=None).update(
            replacement_rented_at=now
        )
        note_machine_rented(attempt)
        transition(
            attempt.job_id,
            S.STARTING,
            now=now,
            kind="rented",
            message=message
            or f"rented instance {instance_id} "
            f"({attempt.gpu_name or 'adopted'}, {_rented_price(attempt)})",
            data={"instance_id": instance_id, "offer_id": attempt.offer_id},
        )
    return True


def _rented_price(attempt: Attempt) -> str:
    """The rented instance's $/h for all its GPUs, per GPU beside it for several."""
    return instance_price(attempt.dph_base, RentDecision.of(attempt).chosen_gpu_count)


def note_machine_rented(attempt: Attempt) -> None:
    """Count a rental of ATTEMPT's machine, and where it is (the admin shows it), from the
    offer it was rented through (a hedged rent's winner: when it wins)."""
    if attempt.machine_id is None:
        return
    offer = dict(RentDecision.of(attempt).offer_summary(attempt.offer_id))
    Machine.objects.note_rented(
        attempt.machine_id,
        gpu_name=attempt.gpu_name,
        at=attempt.rented_at,
        offer=offer,
        attempt_id=attempt.pk,
    )


# --- Attempts ending ---------------------------------------------------------------------------


def close_attempt(
    attempt_id: int, *, reason: str, now: datetime, states=None, due_at: datetime | None = None
) -> Attempt | None:
    """Guarded close (which also kills the attempt's token: its agent gets 410 from then on):
    the attempt if this call ended it, None if it had already ended or, with DUE_AT, if its
    heartbeat deadline has moved past DUE_AT since (a beat arrived: ``Loss.due_at``). Its
    instance is destroyed after commit."""
    live = Attempt.objects.filter(pk=attempt_id, state__in=states or LIVE_ATTEMPT_STATES)
    if due_at is not None:  # in the same UPDATE: no beat can land between check and close
        live = live.filter(heartbeat_deadline__lte=due_at)
    claimed = live.update(
        state=AttemptState.ENDED, end_reason=reason[:40], ended_at=now, pending_command=""
    )
    if not claimed:
        return None
    attempt = Attempt.objects.select_related("job").get(pk=attempt_id)
    machine_incidents.note_rental_end(attempt)  # the team's memory of its machine
    if attempt.instance_id is not None:
        enqueue(DESTROY_TASK, attempt.job.team_id, attempt.instance_id)
    # A race still open ends with it: every racer's instance is destroyed too.
    for racer_id in racers.end_open_racers(attempt_id, reason=reason, now=now):
        enqueue(DESTROY_RACER_TASK, racer_id)
    OfferClaim.objects.release(attempt_id=attempt_id, now=now)
    if Checkpoint.objects.filter(attempt_id=attempt_id, state=CheckpointState.UPLOADING).exists():
        enqueue(DISCARD_UPLOADS_TASK, attempt_id)  # they can never complete now
    return attempt


def handle_loss(loss: Loss, *, now: datetime) -> bool:
    """The host of LOSS.attempt_id is lost: record it, release it; the job recovers, and the
    watchdog plans the replacement (``plan_rent``, with the machine avoided): in the same pass
    when the watchdog found the loss, in its next one when the agent API reported it.

    Never two contracts training: the attempt ends here (its token dies with it) in the same
    transaction that moves the job to recovering, and the partial unique index on live
    attempts lets a job have one, so the replacement is the job's only live attempt; the old
    instance is destroyed after this commits, and its agent, should it come back, is answered
    410 on every call and stops (fencing)."""
    with transaction.atomic():
        # A race that ends in a loss (no racer registered by the start deadline): each racer
        # still in it failed to start, and is blamed as a lost host is (``jobs.racers``).
        racing = Attempt.objects.filter(
            pk=loss.attempt_id, state__in=ON_HOST_STATES, raced__gt=0, instance_id=None
        ).exists()
        if racing and loss.cause != OUTBID:
            for racer_id in racers.end_open_racers(
                loss.attempt_id, reason=loss.cause, now=now, blame=True
            ):
                enqueue(DESTROY_RACER_TASK, racer_id)
        attempt = close_attempt(
            loss.attempt_id, reason=loss.cause, now=now, states=ON_HOST_STATES, due_at=loss.due_at
        )
        if attempt is None:
            if loss.due_at is not None:
                logger.info(
                    "loss of attempt %s (%s) void: a heartbeat moved its deadline after the "
                    "pass judged it",
                    loss.attempt_id,
                    loss.cause,
                )
            # Nothing of a void or repeated loss stays, not even its racers' blame above.
            transaction.set_rollback(True)
            return False
        last_ready = Checkpoint.objects.filter(job_id=attempt.job_id).newest_ready_step()
        # A drill marks its attempt before it destroys the host (``jobs.drill``), and this
        # reads the attempt after the update that closed it: no order of the two makes a
        # drilled host's loss a real one.
        drill = attempt.drilled_at is not None
        Interruption.objects.create(
            job_id=attempt.job_id,
            attempt=attempt,
            cause=loss.cause,
            detail=loss.detail[:300],
            last_heartbeat_at=attempt.last_heartbeat_at,
            detected_at=loss.since or now,
            step_reached=attempt.step,
            drill=drill,
        )
        if loss.cause == OUTBID or drill:
            avoid_machine(attempt)  # another tenant's bid, or our drill: not the machine's doing
        else:
            remember_bad_machine(attempt)
        transition(
            attempt.job_id,
            S.RECOVERING,
            now=now,
            kind="host_lost",
            message=loss_words(attempt, loss.cause, last_ready=last_ready, drill=drill),
            data={
                "cause": loss.cause,
                "step": attempt.step,
                "last_checkpoint": last_ready,
                "attempt_id": attempt.pk,  # its Interruption may be dated earlier (loss.since)
                "drill": drill,
            },
        )
    return True


def loss_words(attempt: Attempt, cause: str, *, last_ready: int | None, drill: bool) -> str:
    """The host_lost event's sentence. Where training was: at its last reported step; "before
    the first training step" once the command started (the timeline said "the training command
    started"); "before training started" while the host was still starting."""
    if attempt.step is not None:
        where = f"at step {attempt.step}"
    elif attempt.running_at is not None:
        where = "before the first training step"
    else:
        where = "before training started"
    head = "fire drill: host lost as planned" if drill else "host lost"
    resumes = f"resumes from checkpoint {last_ready}" if last_ready else "no checkpoint yet"
    return f"{head} ({cause}) {where}; {resumes}"


def move_before_contract_end(attempt_id: int, *, now: datetime) -> bool:
    """A planned move, not a loss: end the attempt before its host's contract runs out (no
    ``Interruption``: nothing went wrong), keep the job off that host, and recover as after a
    loss, from the newest checkpoint."""
    with transaction.atomic():
        attempt = close_attempt(
            attempt_id, reason="contract_expiring", now=now, states=[AttemptState.RUNNING]
        )
        if attempt is None:
            return False
        last_ready = Checkpoint.objects.filter(job_id=attempt.job_id).newest_ready_step()
        avoid_machine(attempt)
        ends_at = attempt.contract_ends_at
        ends = f"{ends_at:%Y-%m-%d %H:%M} UTC" if ends_at else "soon"
        transition(
            attempt.job_id,
            S.RECOVERING,
            now=now,
            kind="planned_move",
            message=f"moved off its host before the contract ends ({ends}) at step "
            f"{attempt.step}; resumes from checkpoint {last_ready}",
            data={"step": attempt.step, "last_checkpoint": last_ready},
        )
    return True


def avoid_machine(attempt: Attempt) -> None:
    """Keep ATTEMPT's job off ATTEMPT's machine from now on."""
    if attempt.machine_id is None:
        return
    job = Job.objects.select_for_update().get(pk=attempt.job_id)
    if attempt.machine_id not in job.avoid_machine_ids:
        Job.objects.filter(pk=job.pk).update(
            avoid_machine_ids=[*job.avoid_machine_ids, attempt.machine_id]
        )


def remember_bad_machine(attempt: Attempt) -> None:
    """Avoid this machine for this job, count it against the machine for every job, and tell
    the team's memory of machines what went wrong: charged to the machine unless it was not
    its doing (``machine_incidents.charge_loss``); the job avoids it either way."""
    if attempt.machine_id is None:
        return
    avoid_machine(attempt)
    Machine.objects.filter(machine_id=attempt.machine_id).update(
        interruptions=F("interruptions") + 1
    )
    machine_incidents.charge_loss(attempt)


def mark_running(attempt: Attempt, *, now: datetime) -> None:
    """The agent reports the training command started: the job runs (again), and is back on a
    machine for every interruption still waiting to train again (``jobs.recovery_times``), from
    the moment the agent says the command started (its ``command_started`` phase, dated on its
    own clock as its first step is) or, from an agent that does not say, this beat's arrival."""
    with transaction.atomic():
        claimed = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STARTING).update(
            state=AttemptState.RUNNING, running_at=now
        )
        if not claimed:
            return
        resumed = attempt.resumed_from_step or 0
        started = (
            Attempt.objects.filter(pk=attempt.pk)
            .values_list("command_started_at", flat=True)
            .first()
        )
        # A beat that arrives late (a loaded host or portal) must not date "back" after the
        # first step the agent dated itself: seen as back 4.64 s, training again 4.41 s.
        back_at = min(started, now) if started is not None else now
        # A replacement lost before it ran leaves its predecessor's interruption open, one that
        # ended before its first step leaves it waiting to train again: this attempt is back
        # for all of them, and their first step will be its own (none stays open forever).
        waiting = Interruption.objects.filter(job_id=attempt.job_id, training_again_at=None).filter(
            Q(running_again_at=None, cancelled_before_recovery=False)
            | Q(replacement__state=AttemptState.ENDED, replacement__first_step_at=None)
        )
        rows = Interruption.objects.filter(pk__in=list(waiting.values_list("pk", flat=True)))
        first_open = rows.filter(running_again_at=None).order_by("detected_at").first()
        rows.filter(running_again_at=None).update(running_again_at=back_at)
        rows.update(replacement_id=attempt.pk, resumed_step=resumed)
        kind, message = "running", "the training command started"
        if first_open is not None:
            back = recovery_times.seconds_between(recovery_times.lost_at(first_open), back_at)
            kind = "back_on_machine"
            message = (
                f"back on a machine after {duration(back)}: the training command started, "
                f"resumed from step {resumed}; training again at its first step"
            )
        transition(attempt.job_id, S.RUNNING, now=now, kind=kind, message=message)
        mark_training_again(attempt.pk, now=now)  # its first step may have come first


def mark_training_again(attempt_id: int, *, now: datetime) -> None:
    """ATTEMPT_ID has reported its first training step: the interruptions it is back on a
    machine for are training again from that step (its ``first_step_at``), with one
    ``running_again`` event (the one notified) naming both figures. Safe to call again."""
    attempt = Attempt.objects.filter(pk=attempt_id).only("job_id", "first_step_at").first()
    if attempt is None or attempt.first_step_at is None:
        return
    with transaction.atomic():
        rows = list(
            Interruption.objects.filter(
                replacement_id=attempt_id, training_again_at=None, running_again_at__isnull=False
            ).order_by("detected_at")
        )
        claimed = Interruption.objects.filter(
            pk__in=[row.pk for row in rows], training_again_at=None
        ).update(  # never before it was back: an agent that dates no command start
            training_again_at=Greatest(
                Value(attempt.first_step_at, output_field=DateTimeField()), F("running_again_at")
            )
        )
        if not claimed:
            return
        first = rows[0]  # the earliest loss: the job's whole wait
        first.training_again_at = max(attempt.first_step_at, first.running_again_at)
        times = recovery_times.recovery_times(first)
        record_event(
            attempt.job_id,
            now=now,
            kind="running_again",
            message=f"training again after {duration(times.training_again_s)} (back on a "
            f"machine after {duration(times.back_on_machine_s)}), resumed from step "
            f"{first.resumed_step}",
            attempt_id=first.attempt_id,
            back_on_machine_s=times.back_on_machine_s,
            training_again_s=times.training_again_s,
            resumed_step=first.resumed_step,
            drill=first.drill,
        )


SETUP_FAILED = "setup_failed"  # the agent's exit reason when the job's setup or code failed


def handle_exit(
    attempt: Attempt, *, exit_code: int | None, reason: str, now: datetime, error: str = ""
) -> None:
    """The training command ended, or the job's setup failed before it (``SETUP_FAILED``, with
    the agent's ERROR sentence, if any). Success finishes the job; a non-zero exit, or any
    setup failure (exit 1 when none was given), is the user's bug: the job fails and nothing is
    re-rented (moving hosts does not fix code), unless the job allows ``max_script_retries``
    more runs: then it restarts from its newest checkpoint. Never a host loss."""
    if reason == SETUP_FAILED:
        exit_code = exit_code or 1  # a setup that failed never finishes the job
    words = exit_words(reason, exit_code, error)
    with transaction.atomic():
        closed = close_attempt(attempt.pk, reason=words.end_reason, now=now, states=ON_HOST_STATES)
        if closed is None or reason == "stopped":
            return
        Attempt.objects.filter(pk=closed.pk).update(exit_code=exit_code)
        if exit_code == 0:
            transition(
                attempt.job_id,
                S.SUCCEEDED,
                now=now,
                kind="finished",
                message=f"finished at step {closed.step}",
                final_step=closed.step,
                finished_at=now,
            )
            return
        _failed_run(closed, words, exit_code=exit_code, now=now)


@dataclass(frozen=True)
class ExitWords:
    """How a failed run reads: the attempt's end reason, the event's sentence, the job's
    ``failure_reason`` (page, API, CLI)."""

    end_reason: str
    message: str
    failure_reason: str
    in_setup: bool = False


def exit_words(reason: str, exit_code: int | None, error: str = "") -> ExitWords:
    """The words for an exit with EXIT_CODE: "setup failed (exit 2): <error>" for a setup,
    "the training command exited with 2" for the command (": rank 1 exited with code 1" added
    when the agent said which rank of a multi-process command failed)."""
    if reason == SETUP_FAILED:
        head = f"setup failed (exit {exit_code})"
        return ExitWords(head, f"{head}: {error}" if error else head, head, in_setup=True)
    if error:  # the agent named the rank of a multi-process command that failed first
        return ExitWords(
            f"exit {exit_code}",
            f"the training command exited with {exit_code}: {error}",
            f"exit code {exit_code}: {error}",
        )
    return ExitWords(
        f"exit {exit_code}",
        f"the training command exited with {exit_code}",
        f"exit code {exit_code}",
    )


def _failed_run(closed: Attempt, words: ExitWords, *, exit_code: int, now: datetime) -> None:
    details = {"exit_code": exit_code, "log_tail": closed.log_tail[-2000:]}
    if words.in_setup:
        details["failed_in"] = "setup"  # notifications say so (notify.messages.failed_facts)
    if script_retries_left(closed.job) > 0:
        transition(
            closed.job_id,
            S.RECOVERING,
            now=now,
            kind="script_retry",
            message=f"{words.message}; running it again",
            data=details,
        )
        return
    transition(
        closed.job_id,
        S.FAILED,
        now=now,
        kind="failed",
        message=words.message,
        data=details,
        failure_reason=words.failure_reason,
        finished_at=now,
    )


def script_retries_left(job: Job) -> int:
    """How many more times a failing command (or setup) may run: failed runs so far vs the
    job's cap."""
    failed_runs = (
        Attempt.objects.filter(job=job)
        .filter(Q(end_reason__startswith="exit ") | Q(end_reason__startswith="setup failed"))
        .exclude(exit_code=None)
        .exclude(exit_code=0)
        .count()
    )
    return job.max_script_retries + 1 - failed_runs


def fail_job(job_id: int, *, why: str, now: datetime) -> None:
    """JOB_ID fails for a reason of its own that no host can fix (WHY says it and what to do);
    its machine is released. The command's own failures go through ``handle_exit``."""
    release_job(
        job_id,
        to=S.FAILED,
        now=now,
        kind="failed",
        message=why,
        reason="job_error",
        failure_reason=why,
        finished_at=now,
    )


def hold_for_attention(job_id: int, *, why: str, data: dict, now: datetime) -> None:
    """Stop renting JOB_ID until a person fixes it (WHY names what is wrong with it, and what
    to do): every rent would fail the same way. A live attempt (planned or requested: the job
    had no host) is closed. ``jobs.attention`` decides when."""
    release_job(
        job_id,
        to=S.NEEDS_ATTENTION,
        now=now,
        kind="needs_attention",
        message=why,
        reason="needs_attention",
        data=data,
        failure_reason=why,  # the job page, the API and the CLI show why it stopped
    )


def requeue_after_fix(job_id: int, *, by: str, now: datetime) -> None:
    """A job held for attention was fixed: queue it and plan its rent."""
    with transaction.atomic():
        transition(
            job_id,
            S.QUEUED,
            now=now,
            kind="fixed",
            message=f"fixed by {by}; renting again",
            next_rent_at=None,
            rent_backoff_s=0,
            failure_reason="",
        )
        after_commit(plan_rent, job_id, now=now)


# --- People and limits stop jobs ----------------------------------------------------------------


def cancel_job(job_id: int, *, now: datetime, by: str = "") -> None:
    """Stop a job for good: release its machine, keep its checkpoints."""
    release_job(
        job_id,
        to=S.CANCELLED,
        now=now,
        kind="cancelled",
        message=f"cancelled {by}".strip(),
        reason="cancelled",
        finished_at=now,
    )


def release_job(
    job_id: int,
    *,
    to: str,
    now: datetime,
    kind: str,
    message: str,
    reason: str,
    data: dict | None = None,
    **fields,
) -> None:
    """Move JOB_ID to TO and release its machine (cancel, budget pause): the guarded transition
    first, then every live attempt closed (its instance destroyed after commit). Checkpoints are
    kept; an interruption still open ends here, not with a recovery."""
    with transaction.atomic():
        transition(job_id, to, now=now, kind=kind, message=message, data=data, **fields)
        for attempt_id in Attempt.objects.live().filter(job_id=job_id).values_list("pk", flat=True):
            close_attempt(attempt_id, reason=reason, now=now)
        if to == S.CANCELLED:
            # A budget pause leaves it open: the job resumes later and the interruption then
            # closes as a recovery (a long one), which is what the status page should count.
            Interruption.objects.filter(job_id=job_id, running_again_at=None).update(
                cancelled_before_recovery=True
            )


def resume_job(job_id: int, *, by: str, now: datetime) -> None:
    """Move a budget-paused job back to the queue; it continues from its newest checkpoint.
    Raises ``BudgetExceeded`` (with the numbers) while the spending gate still refuses it."""
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("team").get(pk=job_id)
        if job.state != S.PAUSED_BUDGET:
            raise BudgetExceeded(f"Job {job.pk} is {job.get_state_display()}, not paused.")
        verdict = spending.gate().resume(job, now=now)
        if not verdict.allowed:
            raise BudgetExceeded(f"Cannot resume: {verdict.reason}. Raise the limit or wait.")
        transition(
            job.pk,
            S.QUEUED,
            now=now,
            kind="budget_resumed",
            message=f"resumed by {by}",
            next_rent_at=None,
            rent_backoff_s=0,
        )
        after_commit(plan_rent, job.pk, now=now)


def pause_for_budget(job_id: int, *, message: str, data: dict, now: datetime) -> None:
    """JOB_ID goes paused_budget (MESSAGE names the limit) and its machine is released; it
    resumes from its newest checkpoint (``resume_job``)."""
    release_job(
        job_id,
        to=S.PAUSED_BUDGET,
        now=now,
        kind="budget_paused",
        reason="budget",
        message=message,
        data=data,
    )
