"""A job's stored spec checked again. A job's ``requirements``, ``profile`` and ``env`` are JSON a
team admin can edit by hand in the admin; before anything prices or rents on them they are read
through the same schema as a submit (``jobs.spec``), so a typo'd key raises
``StoredSpecInvalid`` naming the field ("requirements: unknown key 'gpu_name'"), never a
``TypeError`` deep in the cost model, and such a job is held for a person
(``jobs.attention.hold_if_spec_invalid``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from jobs.models import Job
from jobs.spec import EnvVars, ProfileSpec, RequirementsSpec


class StoredSpecInvalid(ValueError):
    """A job's stored ``requirements``, ``profile`` or ``env`` no longer fit ``JobSpec`` (JSON
    edited by hand). The message names each field in a sentence ("requirements: unknown key
    'gpu_name'"); ``problems`` holds (field, sentence) pairs, the field dotted
    ("requirements.gpu_name")."""

    def __init__(self, job_id: int | None, problems: Sequence[tuple[str, str]]) -> None:
        self.job_id = job_id
        self.problems = tuple(problems)
        super().__init__("; ".join(sentence for _, sentence in self.problems))

    @property
    def fields(self) -> tuple[str, ...]:
        """The dotted fields at fault."""
        return tuple(where for where, _ in self.problems)


@dataclass(frozen=True)
class StoredSpec:
    """A job's stored requirements, profile and env as ``JobSpec`` reads them (defaults filled)."""

    requirements: RequirementsSpec
    profile: ProfileSpec
    env: dict[str, str]


_ENV = TypeAdapter(EnvVars)


# How each stored part is checked, and the keys it knows (for "did you mean").
_SECTIONS: dict[str, tuple[Callable[[Any], Any], tuple[str, ...]]] = {
    "requirements": (RequirementsSpec.model_validate, tuple(RequirementsSpec.model_fields)),
    "profile": (ProfileSpec.model_validate, tuple(ProfileSpec.model_fields)),
    "env": (_ENV.validate_python, ()),
}


def validate_stored(job: Job) -> StoredSpec:
    """JOB's stored requirements, profile and env checked against ``JobSpec``, every problem of
    the three at once. Raises ``StoredSpecInvalid``."""
    parsed: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for section in _SECTIONS:
        try:
            parsed[section] = validated_section(job, section)
        except StoredSpecInvalid as exc:
            problems.extend(exc.problems)
    if problems:
        raise StoredSpecInvalid(job.pk, problems)
    return StoredSpec(**parsed)


def validated_section(job: Job, section: str) -> Any:
    """One stored SECTION of JOB ("requirements", "profile" or "env") read by its schema, with
    ``JobSpec``'s defaults. Raises ``StoredSpecInvalid`` naming each problem."""
    validate, known = _SECTIONS[section]
    try:
        return validate(getattr(job, section))
    except ValidationError as exc:
        problems = [_problem(section, err, known) for err in exc.errors()]
        raise StoredSpecInvalid(job.pk, problems) from None


def _problem(section: str, err: Mapping[str, Any], known: Sequence[str]) -> tuple[str, str]:
    """(dotted field, sentence) for one of pydantic's errors in SECTION."""
    path = ".".join(str(p) for p in err["loc"])
    where = f"{section}.{path}" if path else section
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, known, n=1) if len(err["loc"]) == 1 else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return where, f"{section}: unknown key '{key}'{hint}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if not path:
        if err["type"] in ("model_type", "dict_type"):
            found = type(err["input"]).__name__
            return where, f"{section}: should be an object of keys and values, not a {found}"
        return where, f"{section}: {message}"
    message = message[:1].lower() + message[1:]
    return where, f"{section}: bad value for '{path}': {message} (found {err['input']!r})"
