"""The ready-made jobs (``jobs.job_templates.JOB_TEMPLATES``, the portal's "start from" menu and
``nomadgpu submit --template``) and ``examples/qlora/job.toml`` are jobs that can run: valid
specs, and, for the ones the sandbox runs, a command that names a script of this checkout and
the instance's ``python``, and a profile typed from what the job really does."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from agent.checkpoints.pack import plan_tar
from jobs.job_templates import JOB_TEMPLATES, template_spec
from jobs.models import Job
from jobs.spec import JobSpec
from nomadgpu_cli.pack import pack_folder
from portal.forms import spec_to_initial
from sandbox.timing import image_bytes

QLORA = settings.BASE_DIR / "examples" / "qlora"
SANDBOX_RUNNABLE = ["toy", "qlora-tiny"]


def command_line(spec: dict) -> list[str]:
    """The words of a template's command."""
    return shlex.split(spec["command"])


@pytest.mark.parametrize("name", sorted(JOB_TEMPLATES))
def test_every_template_validates_as_a_job_spec(name):
    JobSpec.model_validate(template_spec(name))


@pytest.mark.parametrize("name", SANDBOX_RUNNABLE)
def test_a_sandbox_template_runs_a_script_of_this_checkout_with_the_instances_python(name):
    # `python`, as on a real host: in the sandbox the instance's own venv, never the portal's
    # interpreter by its path (tests/test_sandbox_instance_python.py).
    python, script, *_ = command_line(template_spec(name))

    assert python == "python"
    assert Path(script).is_file()
    assert Path(script).is_relative_to(settings.BASE_DIR)


def test_the_tiny_qlora_template_installs_the_hf_packages_only_where_they_are_missing():
    spec = template_spec("qlora-tiny")
    check, _, install = spec["setup"].partition(" || ")
    assert check.startswith("python -c ")
    assert shlex.split(install)[:4] == ["python", "-m", "pip", "install"]
    assert "import torch, transformers, peft, accelerate" in check
    packages = Path(shlex.split(install)[-1])
    assert packages == settings.BASE_DIR / "requirements-hf.txt"
    assert command_line(spec)[2:] == ["--tiny"]
    assert spec["total_steps"] == 300


def test_the_field_report_template_says_it_needs_its_code_and_a_gpu_before_installing():
    spec = template_spec("qlora")
    setup = spec["setup"]

    assert "workdir" not in spec  # the portal's form takes the code; the CLI packs job.toml's
    assert setup.index("test -f train.py") < setup.index("cuda.is_available()")
    assert setup.index("cuda.is_available()") < setup.index("pip install -r requirements.txt")
    assert "use the qlora-tiny template" in setup
    assert "real GPU on Vast" in JOB_TEMPLATES["qlora"][0]
    assert command_line(spec) == ["python", "train.py"]


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ([], "no train.py here: attach the examples/qlora folder"),
        (["train.py"], "no CUDA GPU visible to torch"),  # this machine, like the sandbox
    ],
)
def test_the_field_report_templates_setup_stops_at_once_without_code_or_gpu(tmp_path, code, says):
    for name in code:
        (tmp_path / name).write_text("")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    done = subprocess.run(
        ["bash", "-e", "-c", template_spec("qlora")["setup"]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 2
    assert says in done.stderr
    assert "pip" not in done.stdout + done.stderr  # nothing was installed


def test_the_field_report_job_file_packs_its_own_folder_and_validates():
    fields = tomllib.loads((QLORA / "job.toml").read_text())
    assert fields["workdir"] == "."  # relative to the job file: examples/qlora itself
    packed = pack_folder(QLORA, max_bytes=10 * 1024 * 1024)
    packed.close()
    names = {entry.rel for entry in packed.entries}

    assert {"train.py", "requirements.txt"} <= names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    fields["workdir"] = {"kind": "archive", "sha256": packed.sha256}  # what the CLI submits
    spec = JobSpec.model_validate(fields)
    assert spec.requirements.gpu_names == ["RTX 4090"]
    assert spec.requirements.min_cuda == 12.4
    assert (spec.profile.model_gb, spec.total_steps) == (15.0, 300)
    assert fields["setup"] == "pip install -r requirements.txt"
    assert "secrets" not in fields  # the model and the data set are public, not gated
    lines = (QLORA / "requirements.txt").read_text().splitlines()
    pins = [line.split("==")[0] for line in lines if line and not line.startswith("#")]
    assert "torch" not in pins  # the image's own torch 2.5.1 stays


@pytest.mark.django_db
def test_the_tiny_template_submits_through_the_portal_form_as_it_is(client, cast):
    client.force_login(cast.member)
    data = {**spec_to_initial(template_spec("qlora-tiny")), "team": "team-a", "verified_only": "on"}

    response = client.post(reverse("job-new"), data)

    job = Job.objects.get()
    assert response.status_code == 302, response.context["form"].errors
    assert (job.name, job.setup) == ("qlora-tiny", template_spec("qlora-tiny")["setup"])
    assert job.command.endswith("examples/qlora/train.py --tiny")
    assert job.env["QLORA_STEP_SECONDS"] == "0.2"


def test_the_toy_template_types_what_the_toy_does(tmp_path):
    # The first estimate was 4x-20x off because the toy was typed at ProfileSpec's 4 s.
    spec = template_spec("toy")
    profile, env = spec["profile"], spec["env"]
    done = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "examples" / "toy" / "train.py")],
        env={"PYTHONPATH": str(settings.BASE_DIR), **env, "TOY_STEP_SECONDS": "0",
             "NOMAD_CHECKPOINT_DIR": str(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    checkpoints = sorted(tmp_path.iterdir())

    assert profile["reference_seconds_per_step"] == float(env["TOY_STEP_SECONDS"])
    assert profile["checkpoint_every_steps"] == int(env["TOY_CHECKPOINT_EVERY"])
    assert len(checkpoints) == spec["total_steps"] // profile["checkpoint_every_steps"]
    packed_gb = plan_tar(checkpoints[-1]).size / 1024**3
    assert profile["checkpoint_gb"] == pytest.approx(packed_gb, rel=0.1)
    assert profile["upload_gb"] == pytest.approx(len(checkpoints) * packed_gb, rel=0.1)
    assert profile["image_gb"] == pytest.approx(image_bytes(spec["image"]) / 1024**3, rel=0.01)
