"""The job submission form: flat fields for the page, validated through ``jobs.spec.JobSpec``.

The form holds no limits of its own: ``clean`` builds the spec dict and lets ``JobSpec``
decide, then attaches each of pydantic's errors to the field it is about, so the page shows
"Input should be less than or equal to 16" under "GPU count", not in a banner.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from typing import Any

from django import forms
from django.conf import settings

from jobs.code.archives import ArchiveRefused, PreparedPack, prepare_archive
from jobs.spec import JobSpec, ProfileSpec, RequirementsSpec, ValidationError, error_messages
from portal.job_form_fields import (
    BOOLEAN_FIELDS,
    CODE_FIELDSET,
    FIELD_PATHS,
    FIELDSETS,
    LABELS,
    NUMBER_FIELDS,
    WORKDIR_FIELDS,
)


def _code_fields() -> dict[str, forms.Field]:
    text = {"required": False, "strip": True}
    return {
        "workdir_archive": forms.FileField(
            label="Code archive",
            required=False,
            help_text=".tar.gz, .tgz or .zip of your code folder, unpacked as it is into "
            "$NOMAD_WORKDIR (the command's working directory) on every host; at most "
            f"{settings.WORKDIR_MAX_MB} MB, stored encrypted when checkpoints are",
        ),
        "git_url": forms.CharField(
            label="Git repository",
            help_text="Instead of an archive: a clone URL (https://… or git@host:path); every "
            "host checks out the commit the ref names at submit",
            **text,
        ),
        "git_ref": forms.CharField(
            label="Git ref",
            help_text="Branch, tag or full 40-hex commit; empty: HEAD",
            **text,
        ),
        "deploy_key_secret": forms.CharField(
            label="Deploy key secret",
            help_text="For a private repository: the team secret holding an SSH private key",
            **text,
        ),
    }


def workdir_field(about: str) -> str:
    """The form field a workdir refusal or error location ABOUT is shown under."""
    return WORKDIR_FIELDS.get(about, "git_url")


class SecretNamesField(forms.MultipleChoiceField):
    """Checkboxes of the team's secret names. A name that is not offered (another team's page,
    a secret deleted meanwhile) is passed on, not refused here: the submit refuses it with the
    sentence that says what to do (``jobs.code.job_secrets.MissingSecret``)."""

    def valid_value(self, value: str) -> bool:
        return True


def _field(name: str) -> forms.Field:
    label, help_text = LABELS[name]
    if name == "secrets":
        return SecretNamesField(
            label=label, help_text=help_text, required=False, widget=forms.CheckboxSelectMultiple
        )
    if name in BOOLEAN_FIELDS:
        return forms.BooleanField(label=label, help_text=help_text, required=False)
    if name in ("command", "env", "setup", "stage"):
        widget = forms.Textarea(
            attrs={"rows": 3 if name == "command" else 4, "spellcheck": "false"}
        )
    elif name == "rental":
        choices = [(c, c) for c in ("auto", "on-demand", "interruptible")]
        widget = forms.Select(choices=choices)
    elif name == "race":
        widget = forms.Select(choices=[(c, c) for c in ("auto", "off", "2", "3", "4")])
    elif name == "checkpoint":
        widget = forms.Select(choices=[(c, c) for c in ("script", "auto")])
    elif name == "launcher":  # "" is the spec's default: none
        widget = forms.Select(choices=[("", "none"), *((c, c) for c in ("torchrun", "accelerate"))])
    elif name in NUMBER_FIELDS:
        widget = forms.NumberInput(attrs={"step": "any"})
    else:
        widget = forms.TextInput()
    # Text in, JobSpec decides: no limits or types here that could disagree with the spec.
    return forms.CharField(
        label=label, help_text=help_text, required=False, widget=widget, strip=True
    )


def parse_env(text: str) -> dict[str, str] | str:
    """NAME=value lines as a dict, or the message for the first line that is not one."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            return f"line {number} is not NAME=value"
        env[name.strip()] = value
    return env


def parse_stage(text: str) -> list[Any] | str:
    """One TOML inline table per line (job.toml's ``stage`` entries) as a list, or the message
    for the first line that is not one. Their shape is JobSpec's to judge."""
    entries: list[Any] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip().rstrip(",")
        if not line or line.startswith("#"):
            continue
        try:
            entries.append(tomllib.loads(f"entry = {line}")["entry"])
        except tomllib.TOMLDecodeError:
            return f'line {number} is not an entry like {{hf = "ORG/NAME", revision = "main"}}'
    return entries


def stage_lines(entries: list[dict[str, Any]]) -> str:
    """``parse_stage``'s inverse: each entry as an inline table (JSON strings are TOML's)."""
    return "\n".join(
        "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in entry.items()) + "}"
        for entry in entries
    )


def spec_to_initial(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec dict (a template) as the form's flat initial values."""
    initial: dict[str, Any] = {}
    for path, field_name in FIELD_PATHS.items():
        head, _, tail = path.partition(".")
        value = spec.get(head, {}).get(tail) if tail else spec.get(head)
        if value is None:
            continue
        if field_name == "env":
            value = "\n".join(f"{k}={v}" for k, v in value.items())
        elif field_name == "gpu_names":
            value = ", ".join(value)
        elif field_name == "stage":
            value = stage_lines(value)
        initial[field_name] = value
    initial.update(_workdir_initial(spec.get("workdir") or {}))
    return initial


def _workdir_initial(workdir: dict[str, Any]) -> dict[str, Any]:
    # Only a git workdir can be shown again: a file input cannot be pre-filled.
    if workdir.get("kind") != "git":
        return {}
    return {
        "git_url": workdir.get("url", ""),
        "git_ref": workdir.get("ref", ""),
        "deploy_key_secret": workdir.get("deploy_key_secret", ""),
    }


class JobForm(forms.Form):
    """Flat fields; ``cleaned_data["spec"]`` is the validated ``JobSpec``. SECRET_NAMES are
    the team's secret names the form offers (names only: no value is ever read for a form)."""

    def __init__(self, *args: Any, secret_names: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in FIELD_PATHS.values():
            self.fields[name] = _field(name)
        self.fields.update(_code_fields())
        self.code_pack: PreparedPack | None = None  # the archive's pack, once cleaned
        # An empty form shows the spec's defaults (booleans too: verified hosts only is on).
        self.initial = {**spec_defaults(), **self.initial}
        self._offer_secrets(list(secret_names))

    def _offer_secrets(self, names: list[str]) -> None:
        # Names the form was given (a template, a post) that the team lacks are offered too,
        # so the page shows them ticked and the submit says which are missing.
        given, login = self._given_secrets()
        self.fields["secrets"].choices = [(n, n) for n in _union(names, given)]
        self.fields["image_login_secret"].widget = forms.Select(
            choices=[("", "none (a public image)")] + [(n, n) for n in _union(names, [login])]
        )
        if not names:
            self.fields[
                "secrets"
            ].help_text = "The team has no secrets yet: a team admin adds them on the Team page"

    def _given_secrets(self) -> tuple[list[str], str]:
        if self.is_bound:
            data = self.data
            given = data.getlist("secrets") if hasattr(data, "getlist") else data.get("secrets")
            return list(given or []), data.get("image_login_secret", "")
        return list(self.initial.get("secrets") or []), self.initial.get("image_login_secret", "")

    def fieldsets(self):
        """(legend, bound fields) for the page."""
        sets = [FIELDSETS[0], CODE_FIELDSET, *FIELDSETS[1:]]
        return [(legend, [self[name] for name in names]) for legend, names in sets]

    def spec_dict(self) -> dict[str, Any]:
        """The spec dict from the cleaned fields (empty text means "the spec's default")."""
        data: dict[str, Any] = {"requirements": {}, "profile": {}}
        for path, field_name in FIELD_PATHS.items():
            value = self.cleaned_data.get(field_name)
            if field_name == "env":
                value = parse_env(value or "")
                if isinstance(value, str):
                    self.add_error("env", value)
                    continue
            elif field_name == "gpu_names":
                value = [n.strip() for n in (value or "").split(",") if n.strip()]
            elif field_name == "stage":
                value = parse_stage(value or "")
                if isinstance(value, str):
                    self.add_error("stage", value)
                    continue
            elif field_name not in BOOLEAN_FIELDS and value == "":
                continue
            head, _, tail = path.partition(".")
            if tail:
                data[head][tail] = value
            else:
                data[head] = value
        return data

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        data = self.spec_dict()
        data["workdir"] = self.workdir_dict()
        try:
            cleaned["spec"] = JobSpec.model_validate(data)
        except ValidationError as exc:
            for where, message in error_messages(exc).items():
                self.add_error(_field_for(where), message.removeprefix("Value error, "))
        return cleaned

    def workdir_dict(self) -> dict[str, Any] | None:
        """The spec's workdir from the code fields; an archive is checked (and a .zip
        repacked) here, its pack kept in ``code_pack`` for the submit to store."""
        upload = self.cleaned_data.get("workdir_archive")
        url, ref, key = (self.cleaned_data.get(n) or "" for n in CODE_FIELDSET[1][1:])
        if upload and url:
            self.add_error("git_url", "Give an archive or a git repository, not both.")
            return None
        if upload:
            return self._archive_workdir(upload)
        if not url:
            if ref or key:
                self.add_error("git_url", "The git repository is missing.")
            return None
        return {"kind": "git", "url": url, "ref": ref or "HEAD", "deploy_key_secret": key}

    def _archive_workdir(self, upload) -> dict[str, Any] | None:
        try:
            self.code_pack = prepare_archive(upload.name, upload)
        except ArchiveRefused as exc:
            self.add_error("workdir_archive", str(exc))
            return None
        return {"kind": "archive", "sha256": self.code_pack.sha256}


def _union(first: list[str], more: list[str]) -> list[str]:
    return first + [n for n in more if n and n not in first]


def _field_for(where: str) -> str | None:
    """The form field of a pydantic error location ("requirements.num_gpus", "env.FOO")."""
    if where in FIELD_PATHS:
        return FIELD_PATHS[where]
    if where == "workdir" or where.startswith("workdir."):
        return workdir_field(where.split(".")[-1])
    for path, field_name in FIELD_PATHS.items():
        if where.startswith(path + "."):
            return field_name
    return None  # a whole-spec error: shown above the form


def spec_defaults() -> dict[str, Any]:
    """The spec's own defaults as flat initial values (an empty form shows what JobSpec uses)."""
    values = {
        name: f.get_default(call_default_factory=True)
        for name, f in JobSpec.model_fields.items()
        if name not in ("requirements", "profile") and not f.is_required()
    }
    values["requirements"] = RequirementsSpec().model_dump()
    values["profile"] = ProfileSpec().model_dump()
    return spec_to_initial(values)
