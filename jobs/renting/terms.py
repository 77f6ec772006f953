"""A job in the market's terms: the one translation from a job (or a spec not yet submitted)
to what ``hosts.selection`` ranks offers by.

- ``requirements_for`` and ``profile_for`` turn a job's stored ``requirements`` and ``profile``
  into ``selection.Requirements`` and ``selection.JobProfile``. Every value passes through
  ``jobs.spec`` (``RequirementsSpec``, ``ProfileSpec``), so a key a job leaves out takes
  ``JobSpec``'s default, written there once (``rental: auto``, a 5 GB image, ...): the
  selection's dataclasses are always given every field, never left to their own defaults.
- Stored JSON is checked by that same schema: a job hand-edited in the admin with a typo'd key
  raises ``StoredSpecInvalid`` ("requirements: unknown key 'gpu_name'"), not a ``TypeError``.
- ``profile_for`` is corrected by what the team measured on earlier runs of the job's shape
  (``jobs.renting.shape_history``): every figure measured replaces the typed one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hosts import selection
from jobs.models import Checkpoint, Job
from jobs.renting import corrections, measures, shape_history
from jobs.spec import ProfileSpec, RequirementsSpec
from jobs.staging import stage
from jobs.stored_spec import validated_section


def requirements_from_spec(
    spec: RequirementsSpec, *, avoid: Iterable[int] = ()
) -> selection.Requirements:
    """The selection's requirements of SPEC (``JobSpec``'s defaults for what it leaves out),
    with the machines to AVOID."""
    return selection.Requirements(**spec.model_dump(), avoid_machine_ids=frozenset(avoid))


def profile_from_spec(
    spec: ProfileSpec, *, steps_total: int, steps_done: int = 0
) -> selection.JobProfile:
    """The cost model's profile of SPEC for a run of STEPS_TOTAL steps resumed at STEPS_DONE."""
    return selection.JobProfile(**spec.model_dump(), steps_total=steps_total, steps_done=steps_done)


def requirements_for(job: Job) -> selection.Requirements:
    """What a host must have for JOB: its stored requirements over ``JobSpec``'s defaults, and
    its avoid list. Raises ``StoredSpecInvalid`` when the stored JSON no longer fits."""
    spec = validated_section(job, "requirements")
    return requirements_from_spec(spec, avoid=job.avoid_machine_ids)


def profile_for(job: Job, history: measures.History | None = None) -> selection.JobProfile:
    """What the cost model multiplies for JOB, resumed from its newest ready checkpoint, each
    figure its shape's runs measured (HISTORY, else ``shape_history.history_for``) in place of the
    typed one. Raises ``StoredSpecInvalid`` when the stored JSON no longer fits."""
    history = history if history is not None else shape_history.history_for(job)
    return with_staged(corrections.corrected_profile(typed_profile_for(job), history), job, history)


def with_staged(
    profile: selection.JobProfile, job: Job, history: measures.History
) -> selection.JobProfile:
    """PROFILE with JOB's staged files (once mirrored) as its model download, in place of the
    typed ``model_gb``: the agent fetches them on every host. What the command itself still
    downloads (measured, which leaves out the agent's own bytes) comes on top."""
    staged = stage.staged_gb(job)
    if staged is None:
        return profile
    own = history.download.value if history.download is not None else 0.0
    return replace(profile, model_gb=staged + own)


def typed_profile_for(job: Job) -> selection.JobProfile:
    """``profile_for`` as typed, before anything measured corrects it."""
    spec = validated_section(job, "profile")
    resume_step = Checkpoint.objects.filter(job=job).newest_ready_step() or 0
    return profile_from_spec(spec, steps_total=job.total_steps or 0, steps_done=resume_step)
