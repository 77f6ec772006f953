"""Measured or typed: what an estimate is made of, on the new-job preview and the job page."""

from __future__ import annotations

from jobs.models import Job, shape_family, shape_of
from jobs.renting import corrections, measures, reference, shape_history
from jobs.renting.terms import (
    profile_from_spec,
    requirements_for,
    requirements_from_spec,
    typed_profile_for,
)
from jobs.spec import JobSpec
from jobs.stored_spec import StoredSpecInvalid


def spec_history(spec: JobSpec, *, team) -> measures.History:
    """What TEAM's runs of SPEC's shape measured (nothing for a shape never run)."""
    parts = {"image": spec.image, "command": spec.command, "setup": spec.setup}
    gpus = spec.requirements.num_gpus
    family = {n: shape for n, shape in shape_family(**parts).items() if n != gpus}
    return shape_history.history_of(
        team.pk, shape_of(**parts, num_gpus=gpus), image=spec.image, num_gpus=gpus, family=family
    )


def preview_figures(spec: JobSpec, *, team) -> list[corrections.FigureLine]:
    """The new-job preview's figures, each measured (on how many runs) or typed."""
    typed = profile_from_spec(spec.profile, steps_total=spec.total_steps or 0)
    history = spec_history(spec, team=team)
    host = reference.reference_offer(requirements_from_spec(spec.requirements), typed)
    return corrections.figure_lines(typed, history, reference_host=host)


def estimate_figures(job: Job) -> list[corrections.FigureLine]:
    """The job page's figures, each measured (on how many runs) or typed; none while the
    stored spec does not validate (the page says that elsewhere)."""
    try:
        typed = typed_profile_for(job)
        host = reference.reference_offer(requirements_for(job), typed)
    except StoredSpecInvalid:
        return []
    return corrections.figure_lines(typed, shape_history.history_for(job), reference_host=host)
