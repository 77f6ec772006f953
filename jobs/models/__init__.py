"""The jobs app's models, one file per family (Django finds them through this package's
imports, and the rest of the project imports them from ``jobs.models``):

- ``job``: ``Job``, its states and the named sets of them (``JobQuerySet``), its shape;
- ``attempt``: ``Attempt``, one rental of one host for one job, and its instance label;
- ``racer``: ``Racer``, one instance of a hedged rent, and ``OfferClaim``, an offer claimed
  before its create;
- ``checkpoint``: ``Checkpoint``, ready only once verified;
- ``events``: ``JobEvent``, ``Interruption``, ``LossPoint``: what happened to a job;
- ``content``: ``WorkdirPack``, ``StagedObject``: code and weights a team stores once.
"""

from jobs.models.attempt import (
    LIVE_ATTEMPT_STATES,
    ON_HOST_STATES,
    Attempt,
    AttemptQuerySet,
    AttemptState,
    label_for,
    parse_label,
)
from jobs.models.checkpoint import Checkpoint, CheckpointQuerySet, CheckpointState
from jobs.models.content import StagedObject, StagedObjectState, WorkdirPack, WorkdirPackState
from jobs.models.events import (
    LOSS_POINTS_PER_JOB,
    WARNING_EVENTS,
    Interruption,
    JobEvent,
    JobEventManager,
    LossPoint,
    loss_sample_every,
)
from jobs.models.job import (
    ACTIVE_STATES,
    HEARTBEAT_TIMEOUT_INTERVALS,
    MAX_NUM_GPUS,
    NEEDS_HOST_STATES,
    SHAPE_FIELDS,
    STARTED_STATES,
    TERMINAL_STATES,
    Job,
    JobQuerySet,
    JobState,
    shape_family,
    shape_of,
)
from jobs.models.racer import (
    ENDED_RACER_STATES,
    OPEN_RACER_STATES,
    OfferClaim,
    Racer,
    RacerState,
    racer_label_for,
)

__all__ = [
    "ACTIVE_STATES",
    "ENDED_RACER_STATES",
    "HEARTBEAT_TIMEOUT_INTERVALS",
    "LIVE_ATTEMPT_STATES",
    "LOSS_POINTS_PER_JOB",
    "MAX_NUM_GPUS",
    "NEEDS_HOST_STATES",
    "ON_HOST_STATES",
    "OPEN_RACER_STATES",
    "SHAPE_FIELDS",
    "STARTED_STATES",
    "TERMINAL_STATES",
    "WARNING_EVENTS",
    "Attempt",
    "AttemptQuerySet",
    "AttemptState",
    "Checkpoint",
    "CheckpointQuerySet",
    "CheckpointState",
    "Interruption",
    "Job",
    "JobEvent",
    "JobEventManager",
    "JobQuerySet",
    "JobState",
    "LossPoint",
    "OfferClaim",
    "Racer",
    "RacerState",
    "StagedObject",
    "StagedObjectState",
    "WorkdirPack",
    "WorkdirPackState",
    "label_for",
    "loss_sample_every",
    "parse_label",
    "racer_label_for",
    "shape_family",
    "shape_of",
]
