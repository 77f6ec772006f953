"""The job submission form: flat fields for the page, validated through ``jobs.spec.JobSpec``.

The form holds no limits of its own: ``clean`` builds the spec dict and lets ``JobSpec``
decide, then attaches each of pydantic's errors to the field it is about, so the page shows
"Input should be less than or equal to 16" under "GPU count", not in a banner.
"""

from __future__ import annotations

from typing import Any

from django import forms

from jobs.spec import JobSpec, ProfileSpec, RequirementsSpec, ValidationError, error_messages

# Spec path → form field, in the order of the page. Booleans are checkboxes.
FIELD_PATHS: dict[str, str] = {
    "name": "name",
    "image": "image",
    "command": "command",
    "env": "env",
    "total_steps": "total_steps",
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
}
BOOLEAN_FIELDS = {
    "verified_only",
    "datacenter_only",
    "encrypt_checkpoints",
    "start_when_budget_allows",
}
FIELDSETS = [
    ("Job", ["name", "image", "command", "env", "total_steps"]),
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
    ("Rental", ["rental", "max_bid_dph"]),
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
    "env": ("Environment", "One NAME=value per line"),
    "total_steps": ("Total steps", "For progress, ETA and the cost estimate"),
    "gpu_names": ("GPU models", "Comma-separated, e.g. RTX 4090, RTX 3090; empty: any"),
    "num_gpus": ("GPU count", ""),
    "min_gpu_ram_gb": ("Min VRAM per GPU (GiB)", "A 24 GB card reports 23.99 GiB"),
    "min_reliability": ("Min reliability (0-1)", ""),
    "min_inet_down_mbps": ("Min download bandwidth (Mbit/s)", ""),
    "disk_gb": ("Disk (GB)", "Allocated and billed as storage"),
    "min_cuda": ("Min CUDA version", ""),
    "max_dph": ("Max $/h", "GPU plus this job's storage"),
    "rental": (
        "Rental",
        "auto (the cheaper expected total, interruptions priced in), on-demand or interruptible",
    ),
    "max_bid_dph": ("Max bid $/h", "For interruptible rentals; Vast takes $0.001 to $128"),
    "verified_only": ("Verified hosts only", ""),
    "datacenter_only": ("Datacenter hosts only", ""),
    "image_gb": ("Image download (GB)", "Compressed pull"),
    "model_gb": ("Model download (GB)", "Fetched by the command before step 1"),
    "upload_gb": ("Checkpoint uploads (GB)", "All checkpoints of the run"),
    "checkpoint_gb": ("Checkpoint size (GB)", "Downloaded before a resume"),
    "reference_seconds_per_step": ("Seconds per step", "Measured on the reference GPU"),
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


def _field(name: str) -> forms.Field:
    label, help_text = LABELS[name]
    if name in BOOLEAN_FIELDS:
        return forms.BooleanField(label=label, help_text=help_text, required=False)
    if name in ("command", "env"):
        widget = forms.Textarea(
            attrs={"rows": 3 if name == "command" else 4, "spellcheck": "false"}
        )
    elif name == "rental":
        choices = [(c, c) for c in ("auto", "on-demand", "interruptible")]
        widget = forms.Select(choices=choices)
    elif name == "checkpoint":
        widget = forms.Select(choices=[(c, c) for c in ("script", "auto")])
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
        initial[field_name] = value
    return initial


class JobForm(forms.Form):
    """Flat fields; ``cleaned_data["spec"]`` is the validated ``JobSpec``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in FIELD_PATHS.values():
            self.fields[name] = _field(name)
        # An empty form shows the spec's defaults (booleans too: verified hosts only is on).
        self.initial = {**spec_defaults(), **self.initial}

    def fieldsets(self):
        """(legend, bound fields) for the page."""
        return [(legend, [self[name] for name in names]) for legend, names in FIELDSETS]

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
        try:
            cleaned["spec"] = JobSpec.model_validate(data)
        except ValidationError as exc:
            for where, message in error_messages(exc).items():
                self.add_error(_field_for(where), message.removeprefix("Value error, "))
        return cleaned


def _field_for(where: str) -> str | None:
    """The form field of a pydantic error location ("requirements.num_gpus", "env.FOO")."""
    if where in FIELD_PATHS:
        return FIELD_PATHS[where]
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
