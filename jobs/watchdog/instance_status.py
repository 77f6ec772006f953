"""What Vast's instance fields mean for an attempt (condition 1): gone, exited, offline,
unknown twice, the container runtime failed, outbid, given up before running, stopped; and
when a contract ends. Plain functions of an ``Instance``: no query, no provider call.
"""

from __future__ import annotations

from datetime import datetime

from hosts.vast import Instance, container_runtime_failed
from jobs.lifecycle import Loss
from jobs.models import Attempt

LOST_STATUSES = frozenset({"exited", "offline"})


OFFLINE = "provider_offline"  # a host that may come back with its disk (``wait_or_move``)


START_FAILED = "start_failed"  # the host's container runtime could not start the container


BEFORE_RUNNING = frozenset({None, "created", "loading"})  # Vast's actual_status until running


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


def contract_end(instance: Instance | None) -> datetime | None:
    """When INSTANCE's contract ends (Vast's ``end_date``), or None when the provider gives no
    usable one: an end at or before the instance's start (0, say) must not move every job."""
    if instance is None or instance.end_date is None:
        return None
    if instance.start_date is not None and instance.end_date <= instance.start_date:
        return None
    return instance.end_date if instance.end_date.year >= 2020 else None
