"""The team secrets a job names, and the only places their values go.

A job stores names (``Job.secrets``, ``Job.image_login_secret``, a git workdir's
``deploy_key_secret``); the values stay sealed in ``TeamSecret`` and are opened here for:

- the agent's register reply (``register_secrets``): the attempt's own token, over HTTPS;
- Vast's create request, for the registry login only (``image_login_for``): Vast's ``image_login``
  is how a host pulls a private image; the documented instance object does not carry it back
  (``sandbox/README.md``), unlike ``env``, ``onstart`` and ``label``;
- masking (``mask_for``): what an agent sends back is masked by the agent; the server masks the
  log tail again where it keeps it for good (at exit) and where it shows it (job page, member
  API, admin), never on the heartbeat's hot path, which stays two statements.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from jobs.models import Job
from nomadgpu import team_secrets


class MissingSecret(ValueError):
    """A submitted job names a secret its team does not have: ``field`` is the spec field
    ("secrets", "image_login_secret"), ``name`` the missing name, ``str()`` the sentence."""

    def __init__(self, field: str, name: str) -> None:
        super().__init__(team_secrets.missing_refusal(name))
        self.field, self.name = field, name


def refuse_missing(team, names_by_field: dict[str, Iterable[str]]) -> None:
    """Raise ``MissingSecret`` for the first name (by field, in order) TEAM has no secret for.
    One query per field that names any."""
    for field, names in names_by_field.items():
        names = [n for n in names if n]
        if names and (missing := team_secrets.missing_names(team, names)):
            raise MissingSecret(field, missing[0])


def named_by(job: Job) -> list[str]:
    """Every secret name JOB refers to: its ``secrets``, its registry login and its git deploy
    key (a workdir that has one)."""
    names = list(job.secrets or [])
    workdir = job.workdir if isinstance(job.workdir, dict) else {}
    for extra in (job.image_login_secret, workdir.get("deploy_key_secret")):
        if extra and extra not in names:
            names.append(str(extra))
    return names


def register_secrets(job: Job) -> dict[str, str]:
    """The values of JOB's ``secrets`` by name, for the agent's register reply. A secret
    deleted since the submit is left out (the command runs without it)."""
    return team_secrets.values_for(job.team_id, job.secrets or [])


def image_login_for(job: Job) -> str | None:
    """Vast's ``image_login`` for JOB (e.g. ``-u USER -p TOKEN ghcr.io``), or None."""
    if not job.image_login_secret:
        return None
    return team_secrets.values_for(job.team_id, [job.image_login_secret]).get(
        job.image_login_secret
    )


def login_password(image_login: str) -> str:
    """The password in docker login arguments ("-u USER -p TOKEN ghcr.io" → "TOKEN"), or "":
    a log may quote the token alone."""
    words = image_login.split()
    for flag, word in itertools.pairwise(words):
        if flag in ("-p", "--password"):
            return word
    return next((w.split("=", 1)[1] for w in words if w.startswith("--password=")), "")


def masker(job: Job) -> Callable[[str], str]:
    """A function that masks the values of every secret JOB names in a text (one query now,
    none per text; none at all when the job names no secret). The registry login's password
    is masked on its own too."""
    names = named_by(job)
    found = team_secrets.values_for(job.team_id, names) if names else {}
    values = list(found.values())
    if job.image_login_secret in found:
        values.append(login_password(found[job.image_login_secret]))
    if not values:
        return lambda text: text
    return lambda text: team_secrets.mask(text, values)


def mask_for(job: Job, text: str) -> str:
    """TEXT (a log tail) with the values of every secret JOB names masked. No query when the
    text is empty or the job names none."""
    return masker(job)(text) if text else text
