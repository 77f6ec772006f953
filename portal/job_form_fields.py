"""The job form's fields as tables: which spec path each form field fills, which are checkboxes
or numbers, their labels and help, and the fieldsets they are shown in (``portal.forms.JobForm``
builds its fields from these).
"""

from __future__ import annotations

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
