"""The CLI end to end on the sandbox: ``nomadgpu submit --follow`` of the toy job until it
succeeds, and ``nomadgpu drill`` destroying its host and waiting for the recovery — the real
web process, worker, agent and trainer behind the member API."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Interruption, Job, JobState
from jobs.recovery_times import recovery_times
from nomadgpu import api_tokens
from nomadgpu.humanize import duration
from nomadgpu.models import Role
from tests.support.cli import Follower
from tests.support.factories import MembershipFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.toy import TOY, TOY_ENV
from tests.support.waiting import wait_running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def toy_job_toml() -> str:
    env = "\n".join(f'{k} = "{v}"' for k, v in TOY_ENV.items())
    gpus = ", ".join(f'"{g}"' for g in FIELD_REPORT_REQUIREMENTS["gpu_names"])
    return f"""
name = "toy-from-cli"
image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
command = "{TOY}"
total_steps = 300
heartbeat_interval_s = 1

[env]
{env}

[requirements]
gpu_names = [{gpus}]
disk_gb = 20.0

[profile]
image_gb = 3.0
upload_gb = 0.01
"""


@pytest.fixture
def admin_token(supervisor) -> str:
    MembershipFactory(team=supervisor.team, user=supervisor.user, role=Role.ADMIN)
    return api_tokens.create_token(user=supervisor.user, name="e2e", now=timezone.now())[1]


def event_kinds(output: str) -> list[str]:
    return [m[1] for m in re.finditer(r"^\d\d:\d\d:\d\d (\w+)", output, re.MULTILINE)]


def test_submit_follow_runs_the_toy_job_to_success_on_the_sandbox(
    live_server, admin_token, tmp_path
):
    job_file = tmp_path / "toy.toml"
    job_file.write_text(toy_job_toml())

    follower = Follower(live_server.url, admin_token, "submit", str(job_file), "--follow")
    code = follower.finish(timeout=240)

    out = follower.output
    job = Job.objects.get()
    assert code == 0, out
    assert job.state == JobState.SUCCEEDED
    kinds = event_kinds(out)
    assert kinds[:4] == ["submitted", "renting", "rented", "running"], kinds
    assert kinds[-1] == "finished"
    steps = [int(m[1]) for m in re.finditer(r"\] (\d+)/300 ", out)]
    assert len(steps) >= 3, out  # the bar moved while training, not only at the end
    assert steps == sorted(steps)
    assert steps[-1] == 300
    assert re.search(r"\] \d+/300 +\d+%  ETA \d+ s  running", out)
    assert out.splitlines()[-1].startswith(f"job {job.pk} succeeded; cost $")


def test_drill_destroys_the_host_and_reports_the_recovery(supervisor, live_server, admin_token):
    job = supervisor.submit_toy()
    first = wait_running(job, timeout=90)

    follower = Follower(live_server.url, admin_token, "drill", str(job.pk))
    code = follower.finish(timeout=180)

    out = follower.output
    assert code == 0, out
    assert f"destroyed instance {first.instance_id} (attempt 1)" in out
    assert "host_lost" in event_kinds(out)
    assert event_kinds(out)[-1] == "running_again"
    interruption = Interruption.objects.get(attempt=first)
    assert interruption.drill
    assert interruption.training_again_at is not None
    assert f"resumed from step {interruption.resumed_step}" in out
    times = recovery_times(interruption)
    assert (
        f"back on a machine after {duration(times.back_on_machine_s)}, "
        f"training again after {duration(times.training_again_s)}" in out
    )
    assert "recorded as a fire drill; detected after " in out
    wait_until(
        lambda: supervisor.sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the destroyed instance to be gone",
    )


def test_manage_py_drill_shares_the_destroy_and_prints_the_recovery(supervisor):
    job = supervisor.submit_toy()
    first = wait_running(job, timeout=90)
    out = io.StringIO()

    call_command("drill", str(job.pk), "--timeout", "120", stdout=out)

    interruption = Interruption.objects.get(attempt=first)
    assert interruption.drill
    assert interruption.training_again_at is not None
    assert job.events.filter(kind="drill", data__instance_id=first.instance_id).exists()
    assert f"training again after {duration(recovery_times(interruption).training_again_s)}" in (
        out.getvalue()
    )
    assert f"resumed from step {interruption.resumed_step}" in out.getvalue()
