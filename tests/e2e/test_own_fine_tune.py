"""A team's own fine-tune end to end: its code comes only from ``workdir`` (packed and uploaded
by ``nomadgpu submit``), ``setup`` writes a marker the command checks, and a team secret reaches
the command. The host is destroyed; the replacement gets code, setup and secret again, and the
job finishes with the uninterrupted weights. The secret's value is nowhere: not in the
sandbox's record of the create request nor in any of its files and logs, not on the job page,
in the member API, the events or the stored log tails."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.models import Job, JobEvent, JobState
from nomadgpu import api_tokens
from nomadgpu.models import Role
from tests.support.cli import Follower
from tests.support.factories import MembershipFactory, TeamSecretFactory
from tests.support.instances import live_instances
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import ROOT, wait_until
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_checkpoint, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET = "hf_e2e_0nly_in_the_command_9f3a"
ENV = toy_env(steps=200, every=25, step_seconds=0.05)

# The command: proves the setup ran on this host and the secret arrived, prints the secret
# (the agent must mask it), then trains with the toy trainer that came in the same folder.
RUN_PY = """
import os, runpy, sys
from pathlib import Path
here = Path(os.environ["NOMAD_WORKDIR"])
assert Path.cwd() == here, (Path.cwd(), here)
marker = (here / "setup-marker.txt").read_text().strip()
assert marker == "set up", marker
token = os.environ["HF_TOKEN"]
assert token.startswith("hf_e2e_"), "the secret did not arrive"
print(f"setup marker found; token is {token}", flush=True)
sys.argv = ["train.py"]
runpy.run_path(str(here / "train.py"), run_name="__main__")
"""


def job_toml(code: Path) -> str:
    env = "\n".join(f'{k} = "{v}"' for k, v in ENV.items())
    gpus = ", ".join(f'"{g}"' for g in FIELD_REPORT_REQUIREMENTS["gpu_names"])
    return f"""
name = "own-fine-tune"
image = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
workdir = "{code.name}"
setup = \"\"\"
echo "setup ran on $(hostname)"
echo "set up" > setup-marker.txt
\"\"\"
command = "{sys.executable} run.py"
secrets = ["HF_TOKEN"]
total_steps = {ENV["TOY_STEPS"]}
heartbeat_interval_s = 1

[env]
{env}

[requirements]
gpu_names = [{gpus}]
disk_gb = 20.0
rental = "on-demand"

[profile]
image_gb = 3.0
upload_gb = 0.01
"""


def code_folder(root: Path) -> Path:
    code = root / "code"
    code.mkdir()
    (code / "run.py").write_text(RUN_PY)
    shutil.copy(ROOT / "examples" / "toy" / "train.py", code / "train.py")
    (code / ".gitignore").write_text("outputs/\n")
    (code / "outputs").mkdir()
    (code / "outputs" / "big.bin").write_bytes(b"\0" * 1024)  # ignored: never packed
    return code


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under ROOT whose bytes contain NEEDLE. A destroyed instance's venv is removed
    in the background (``sandbox.instance_python.discard``) and may vanish during the walk:
    ``os.walk`` skips a folder gone under it, where ``Path.rglob`` raised."""
    found = []
    paths = (Path(folder, name) for folder, _, names in os.walk(root) for name in names)
    for path in paths:
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


def test_code_setup_and_a_secret_reach_every_host_and_the_secret_nowhere_else(
    supervisor, live_server, tmp_path, client
):
    team = supervisor.team
    MembershipFactory(team=team, user=supervisor.user, role=Role.ADMIN)
    TeamSecretFactory(team=team, name="HF_TOKEN", value=SECRET)
    token = api_tokens.create_token(user=supervisor.user, name="e2e", now=timezone.now())[1]
    job_file = tmp_path / "job.toml"
    job_file.write_text(job_toml(code_folder(tmp_path)))

    submitted = Follower(live_server.url, token, "submit", str(job_file))
    assert submitted.finish(timeout=60) == 0, submitted.output
    assert "packed" in submitted.output
    job = Job.objects.get()
    assert job.workdir["kind"] == "archive"

    first = wait_running(job, 1, timeout=90)
    wait_checkpoint(job, attempt=first)
    supervisor.sandbox.inject(first.instance_id, "destroy")
    second = wait_running(job, 2, timeout=90)
    wait_state(job, JobState.SUCCEEDED, timeout=120)

    for attempt in (first, second):
        attempt.refresh_from_db()
        assert attempt.workdir_ready_at is not None  # code fetched on this host
        assert attempt.setup_done_at is not None  # and set up: run.py asserts the marker
        scratch = Path(supervisor.sandbox.debug(attempt.instance_id)["scratch"])
        masked = files_holding(scratch, b"setup marker found; token is ***")
        assert masked, f"attempt {attempt.number}: the command never printed its check"
    assert f"final-digest: {toy_digest(ENV)}" in second.log_tail

    needle = SECRET.encode()
    assert files_holding(supervisor.sandbox.state_dir, needle) == []  # creates, logs, scratch
    client.force_login(supervisor.user)
    page = client.get(f"/jobs/{job.pk}/").content
    api = client.get(f"/api/jobs/{job.pk}").content
    logs = client.get(f"/api/jobs/{job.pk}/logs").content
    assert needle not in page
    assert needle not in api
    assert needle not in logs
    assert b"HF_TOKEN" in page  # the secret's name is shown, never its value
    for event in JobEvent.objects.filter(job=job):
        assert SECRET not in event.message
        assert SECRET not in str(event.data)
    assert all(SECRET not in a.log_tail for a in job.attempts.all())
    wait_until(
        lambda: not live_instances(supervisor.sandbox, job),
        timeout=30,
        what="no instance of the job left billing",
    )
