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

# Spec path → form field, in the order of the page. Booleans are checkboxes.
FIELD_PATHS: dict[str, str] = {
    "name": "name",
    "image": "image",
    "command": "command",
    "launcher": "launcher",
    "env": "env",
    "total_steps": "total_steps",
    "setup": "setup",
    "secrets": "secrets",
    "image_login_secret": "image_login_secret",
    "requirements.gpu_names": "gpu_names",
    "requirements.num_gpus": "num_gpus",
    "requirements.min_gpu_ram_gb": "min_gpu_ram_gb",
    "requirements.min_reliability": "min_reliability",
    "requirements.min_inet_down_mbps": "min_inet_down_mbps",
    "requirements.disk_gb": "disk_gb",
    "requirements.min_cuda": "min_cuda",
    "requirements.verified_only": "verified_only",
    "requirements.datacenter_only": "datacenter_only",
    "requirements.max_dph": "max_dph",
    "requirements.rental": "rental",
    "requirements.max_bid_dph": "max_bid_dph",
    "race": "race",
    "profile.image_gb": "image_gb",
    "profile.model_gb": "model_gb",
    "profile.upload_gb": "upload_gb",
    "profile.checkpoint_gb": "checkpoint_gb",
    "profile.reference_seconds_per_step": "reference_seconds_per_step",
    "profile.reference_gpu": "reference_gpu",
    "profile.container_start_s": "container_start_s",
    "profile.checkpoint_every_steps": "checkpoint_every_steps",
    "profile.checkpoint": "checkpoint",
    "keep_last": "keep_last",
    "encrypt_checkpoints": "encrypt_checkpoints",
    "heartbeat_interval_s": "heartbeat_interval_s",
    "start_timeout_s": "start_timeout_s",
    "stall_timeout_s": "stall_timeout_s",
    "max_script_retries": "max_script_retries",
    "budget_usd": "budget_usd",
    "start_when_budget_allows": "start_when_budget_allows",
    "stage": "stage",
}
BOOLEAN_FIELDS = {
    "verified_only",
    "datacenter_only",
    "encrypt_checkpoints",
    "start_when_budget_allows",
}
FIELDSETS = [
    ("Job", ["name", "image", "command", "launcher", "env", "total_steps"]),
    ("Setup and secrets", ["setup", "stage", "secrets", "image_login_secret"]),
    (
        "GPU requirements",
        [
            "gpu_names",
            "num_gpus",
            "min_gpu_ram_gb",
            "min_reliability",
            "min_inet_down_mbps",
            "disk_gb",
            "min_cuda",
            "max_dph",
            "verified_only",
            "datacenter_only",
        ],
    ),
    ("Rental", ["rental", "max_bid_dph", "race"]),
    (
        "Cost model",
        [
            "image_gb",
            "model_gb",
            "upload_gb",
            "checkpoint_gb",
            "reference_seconds_per_step",
            "reference_gpu",
            "container_start_s",
            "checkpoint_every_steps",
        ],
    ),
    (
        "Checkpoints and supervision",
        [
            "checkpoint",
            "keep_last",
            "encrypt_checkpoints",
            "heartbeat_interval_s",
            "start_timeout_s",
            "stall_timeout_s",
            "max_script_retries",
        ],
    ),
    ("Budget", ["budget_usd", "start_when_budget_allows"]),
]

LABELS = {
    "name": ("Name", ""),
    "image": (
        "Image",
        "Docker image the host pulls, e.g. pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
    ),
    "command": ("Command", "Runs inside the container; resumes from $NOMAD_CHECKPOINT_DIR"),
    "launcher": (
        "Launcher",
        "torchrun or accelerate: one process per GPU (GPU count), the command being the script "
        "and its arguments; none: the command runs as it is",
    ),
    "env": ("Environment", "One NAME=value per line"),
    "stage": (
        "Staged model files",
        'One entry per line, as in job.toml: {hf = "ORG/NAME", revision = "main"} or '
        '{url = "https://…", path = "name"}; mirrored once into the team\'s storage, laid out '
        "in the Hugging Face cache on every host",
    ),
    "total_steps": ("Total steps", "For progress, ETA and the cost estimate"),
    "setup": (
        "Setup",
        "Shell lines run once per host before the command, e.g. pip install -r requirements.txt",
    ),
    "secrets": (
        "Secrets",
        "Team secrets put in the command's environment; values are never shown",
    ),
    "image_login_secret": (
        "Registry login",
        "For a private image: the team secret holding Vast's login, -u USER -p TOKEN ghcr.io",
    ),
    "gpu_names": ("GPU models", "Comma-separated, e.g. RTX 4090, RTX 3090; empty: any"),
    "num_gpus": ("GPU count", ""),
    "min_gpu_ram_gb": ("Min VRAM per GPU (GiB)", "A 24 GB card reports 23.99 GiB"),
    "min_reliability": ("Min reliability (0-1)", ""),
    "min_inet_down_mbps": ("Min download bandwidth (Mbit/s)", ""),
    "disk_gb": ("Disk (GB)", "Allocated and billed as storage"),
    "min_cuda": ("Min CUDA version", ""),
    "max_dph": ("Max $/h", "GPU plus this job's storage, for all the host's GPUs together"),
    "rental": (
        "Rental",
        "auto (the cheaper expected total, interruptions priced in), on-demand or interruptible",
    ),
    "max_bid_dph": (
        "Max bid $/h",
        "For interruptible rentals, all GPUs together; Vast takes $0.001 to $128",
    ),
    "race": (
        "Hedged rents",
        "auto: create 2-3 hosts at once and keep the first that is ready, when the wait it saves "
        "is worth more than the others cost; off: one at a time; N: always N",
    ),
    "verified_only": ("Verified hosts only", ""),
    "datacenter_only": ("Datacenter hosts only", ""),
    "image_gb": ("Image download (GB)", "Compressed pull"),
    "model_gb": ("Model download (GB)", "Fetched by the command before step 1"),
    "upload_gb": ("Checkpoint uploads (GB)", "All checkpoints of the run"),
    "checkpoint_gb": ("Checkpoint size (GB)", "Downloaded before a resume"),
    "reference_seconds_per_step": (
        "Seconds per step",
        "Measured on the GPU count above of the reference GPU",
    ),
    "reference_gpu": ("Reference GPU", ""),
    "container_start_s": ("Container start (s)", ""),
    "checkpoint_every_steps": (
        "Checkpoint every (steps)",
        "What an interruption redoes half of; 0: a tenth of the run",
    ),
    "checkpoint": (
        "Checkpoint interval",
        "script: the script's own; auto: the supervisor also asks every √(2·δ·MTBF) for the host",
    ),
    "keep_last": ("Checkpoints to keep", "Older ready checkpoints are pruned"),
    "encrypt_checkpoints": ("Encrypt checkpoints", "AES-256-GCM with a key of this job"),
    "heartbeat_interval_s": ("Heartbeat interval (s)", ""),
    "start_timeout_s": ("Start timeout (s)", "Image pull and agent start"),
    "stall_timeout_s": ("Stall timeout (s)", "No new step for this long is a lost host"),
    "max_script_retries": ("Script retries", "A crash of the command is a bug: usually 0"),
    "budget_usd": ("Budget (USD)", "The job pauses when it reaches it; empty: team limits only"),
    "start_when_budget_allows": ("Wait for budget", "Queue instead of refusing when over a limit"),
}
NUMBER_FIELDS = {
    "total_steps",
    "num_gpus",
    "min_gpu_ram_gb",
    "min_reliability",
    "min_inet_down_mbps",
    "disk_gb",
    "min_cuda",
    "max_dph",
    "max_bid_dph",
    "image_gb",
    "model_gb",
    "upload_gb",
    "checkpoint_gb",
    "reference_seconds_per_step",
    "container_start_s",
    "checkpoint_every_steps",
    "keep_last",
    "heartbeat_interval_s",
    "start_timeout_s",
    "stall_timeout_s",
    "max_script_retries",
    "budget_usd",
}


# The job's code: an uploaded archive or a git repository (``JobSpec.workdir``). Not in
# FIELD_PATHS: several fields make one spec value, and the archive is a file.
CODE_FIELDSET = ("Code", ["workdir_archive", "git_url", "git_ref", "deploy_key_secret"])
# A refusal's ``about`` (jobs.code.packs, pydantic's location under workdir) → its field.
WORKDIR_FIELDS = {
    "sha256": "workdir_archive",
    "size": "workdir_archive",
    "archive": "workdir_archive",
    "url": "git_url",
    "git": "git_url",
    "ref": "git_ref",
    "deploy_key_secret": "deploy_key_secret",
}


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
