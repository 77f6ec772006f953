"""The stall rule: when a host that heartbeats normally still counts as lost, because training
stopped moving. Plain values in, so the heartbeat (deciding on an incoming beat) and the
watchdog (deciding on the stored attempt) ask the same question without importing each other.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# "" is an attempt no heartbeat has described yet: nothing says it is busy with anything but
# training. Restoring a checkpoint, uploading one and exiting move no steps however long they
# take, so they never stall.
TRAINING_PHASES = frozenset({"running", ""})


def is_stalled(
    *,
    phase: str,
    step_before: int | None,
    step_now: int | None,
    last_progress_at: datetime | None,
    running_at: datetime | None,
    stall_timeout_s: float,
    now: datetime,
) -> bool:
    """Whether training has gone STALL_TIMEOUT_S without a new step at NOW.

    PHASE is the agent's latest phase; STEP_NOW its latest step and STEP_BEFORE the one stored
    before it (the same value when no new beat is being decided on). A step above STEP_BEFORE,
    or a first step, is progress. The time counts from the last progress (LAST_PROGRESS_AT), or
    from when training started (RUNNING_AT) if a step was never seen to rise. A script that has
    never reported a step gives nothing to measure, so it never stalls, and a beat without a
    step after steps were seen is not judged.
    """
    if phase not in TRAINING_PHASES:
        return False
    if step_now is not None and (step_before is None or step_now > step_before):
        return False
    if step_now is None and (step_before is not None or last_progress_at is None):
        # A beat that carries no step after steps were seen (an agent restarted in the same
        # container has not read its progress yet) says nothing; nor does a script that has
        # never reported one.
        return False
    since = last_progress_at or running_at
    return since is not None and now - since >= timedelta(seconds=stall_timeout_s)
