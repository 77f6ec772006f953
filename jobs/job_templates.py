"""The job templates: pre-filled specs for the portal's "start from" menu and ``nomadgpu submit
--template``. The toy and the tiny QLoRA run in the sandbox with this checkout (sandbox
instances are processes on this machine) and the instance's own ``python``; ``qlora`` is the
field report's job, for a real GPU.

The sandbox templates name their interpreter ``python``, as a job on a real host does (the
image's: ``/opt/conda/bin/python`` in ``pytorch/pytorch``). In the sandbox that is the
instance's own environment, a venv layered over the one the sandbox runs in
(``sandbox/instance_python.py``, docs/sandbox.md), so the tiny QLoRA's setup installs into the
instance and never into the portal's ``.venv``.
"""

from __future__ import annotations

import shlex
import tomllib
from typing import Any

from django.conf import settings

# What the sandbox bills for the templates' image, pytorch/pytorch (``sandbox/timing.py``
# IMAGE_BYTES: 3.6 GB compressed), in the GiB the cost model prices traffic in.
PYTORCH_IMAGE_GB = 3.35
# A checkpoint as the agent uploads it (an uncompressed tar, agent/checkpoints/pack.py): the
# toy's 8 KB of weights and its state make 20 KiB; the tiny QLoRA's adapters, optimizer and
# trainer state 270 KiB (measured on examples/qlora/train.py --tiny, transformers 5.23).
TOY_CHECKPOINT_GB = 0.00002
QLORA_TINY_CHECKPOINT_GB = 0.00026


def _toy_template() -> dict[str, Any]:
    # The sandbox runs a command on this machine, so the toy is a script of this checkout. Its
    # profile is what it does: TOY_STEP_SECONDS a step (its arithmetic on 8 KB of weights takes
    # microseconds) and a checkpoint every TOY_CHECKPOINT_EVERY steps.
    return {
        "name": "toy",
        "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
        "command": f"python {settings.BASE_DIR / 'examples' / 'toy' / 'train.py'}",
        "env": {"TOY_STEPS": "300", "TOY_CHECKPOINT_EVERY": "50", "TOY_STEP_SECONDS": "0.2"},
        "total_steps": 300,
        "heartbeat_interval_s": 5,
        "requirements": {"gpu_names": ["RTX 4090"], "disk_gb": 20.0},
        "profile": {
            "image_gb": PYTORCH_IMAGE_GB,
            "model_gb": 0.0,
            "reference_seconds_per_step": 0.2,
            # GPU-billed time besides the steps: the agent's start, the last upload, the exit
            # (about 3 s on the sandbox; ProfileSpec's 60 s is a real image's start).
            "container_start_s": 10.0,
            "checkpoint_every_steps": 50,
            "checkpoint_gb": TOY_CHECKPOINT_GB,
            "upload_gb": 0.00012,  # six checkpoints a run
        },
    }


def _qlora_tiny_template() -> dict[str, Any]:
    # examples/qlora/train.py --tiny: a random two-layer Qwen2 + LoRA on the CPU, nothing
    # downloaded. Its setup installs the HF packages only where they are missing, into the
    # instance's python (in the sandbox: the instance's venv, which sees what the sandbox's own
    # environment holds). Paced to QLORA_STEP_SECONDS a step, a checkpoint every 25 steps.
    train = shlex.quote(str(settings.BASE_DIR / "examples" / "qlora" / "train.py"))
    packages = shlex.quote(str(settings.BASE_DIR / "requirements-hf.txt"))
    return {
        "name": "qlora-tiny",
        "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",  # what a real host would pull
        "setup": 'python -c "import torch, transformers, peft, accelerate" 2>/dev/null'
        f" || python -m pip install -r {packages}",
        "command": f"python {train} --tiny",
        "env": {
            "QLORA_SAVE_STEPS": "25",
            "QLORA_BATCH_SIZE": "2",
            "QLORA_GRAD_ACCUM": "1",
            # 300 steps take 2 s on the CPU: paced to a minute, so that a drill lands mid-run.
            "QLORA_STEP_SECONDS": "0.2",
            "OMP_NUM_THREADS": "1",  # the sandbox shares this machine's cores with the portal
            "HF_HUB_OFFLINE": "1",
        },
        "total_steps": 300,
        "heartbeat_interval_s": 5,
        "requirements": {"gpu_names": ["RTX 4090"], "disk_gb": 20.0},
        "profile": {
            "image_gb": PYTORCH_IMAGE_GB,
            "model_gb": 0.0,
            # Its QLORA_STEP_SECONDS pause and about 0.1 s of CPU work a step.
            "reference_seconds_per_step": 0.3,
            # The setup's import check and the script's imports of torch and transformers (about
            # 25 s on a CPU: 50 unpaced steps took 30 s, 4 s of them training), the last upload.
            "container_start_s": 40.0,
            "checkpoint_every_steps": 25,
            "checkpoint_gb": QLORA_TINY_CHECKPOINT_GB,
            "upload_gb": 0.0031,  # twelve checkpoints a run
        },
    }


# The real job needs its code and a CUDA GPU. The portal cannot read a folder on the submitter's
# disk (job.toml's `workdir = "."` is for the CLI), so the code is attached in the form; without
# it, or on a host without a GPU (the sandbox), setup stops at once saying so, before any install.
_QLORA_NEEDS = (
    'test -f train.py || { echo "no train.py here: attach the examples/qlora folder as the'
    " job's code (nomadgpu submit examples/qlora/job.toml does it)\" >&2; exit 2; }\n"
    'python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null'
    ' || { echo "no CUDA GPU visible to torch: this job needs a real GPU host;'
    ' in the sandbox, use the qlora-tiny template" >&2; exit 2; }\n'
)


def _qlora_template() -> dict[str, Any]:
    spec = tomllib.loads((settings.BASE_DIR / "examples" / "qlora" / "job.toml").read_text())
    spec.pop("workdir", None)  # a folder on the submitter's disk: the CLI packs it
    spec["setup"] = _QLORA_NEEDS + spec.get("setup", "")
    return spec


# Pre-filled specs for the portal's "start from" menu and `nomadgpu submit --template`.
JOB_TEMPLATES = {
    "toy": ("Toy trainer (CPU, runs in the sandbox in a minute)", _toy_template),
    "qlora-tiny": (
        "QLoRA, tiny: a random Qwen2 + LoRA on the CPU (runs in the sandbox in a minute)",
        _qlora_tiny_template,
    ),
    "qlora": (
        "Field report: QLoRA Qwen2.5-7B on one RTX 4090 (a real GPU on Vast; attach "
        "examples/qlora as the job's code)",
        _qlora_template,
    ),
}


def template_spec(name: str) -> dict[str, Any]:
    """The raw spec dict of template NAME (KeyError when unknown)."""
    return JOB_TEMPLATES[name][1]()
