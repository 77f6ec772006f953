"""Jobs on several GPUs of one host, without torch: the ``launcher`` field and the process
counts a command asks for (``jobs.spec``), the command the agent builds from it
(``agent.launch``), which rank failed (torchrun's error summary), the register reply, and the
agent reaching ranks that a launcher started in sessions of their own (``agent.procs``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from agent import launch, procs
from agent.assignment import parse_assignment
from agent.phases.command import launched_command
from jobs.lifecycle import exit_words
from jobs.spec import JobSpec, ValidationError, error_messages, submit_spec
from portal.forms import JobForm
from tests.support.agent_api import call
from tests.support.agent_fake_supervisor import FakeJob, FakeSupervisor, start_agent, toy_command
from tests.support.agent_runs import group_is_gone, steps_seen
from tests.support.factories import JobFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.toy import FAST

LAUNCHER = Path(__file__).parent / "support" / "session_launcher.py"
BASE = {"name": "j", "image": "img:1"}

# What torchrun 2.x prints last when a rank fails (torch.distributed.elastic's ChildFailedError).
SUMMARY = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 9, in <module>
[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered
W1203 16:09:52.418000 4242 torch/distributed/elastic/multiprocessing/api.py:908] Sending \
process 4243 closing signal SIGTERM
E1203 16:09:52.601000 4242 torch/distributed/elastic/multiprocessing/api.py:882] failed \
(exitcode: 1) local_rank: 1 (pid: 4244) of binary: /usr/bin/python
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_16:09:52
  host      : c7f1
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4244)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def spec(command: str, launcher: str | None = None, gpus: int = 2) -> JobSpec:
    return JobSpec.model_validate(
        {**BASE, "command": command, "launcher": launcher, "requirements": {"num_gpus": gpus}}
    )


def refusal(command: str, launcher: str | None = None, gpus: int = 2) -> str:
    with pytest.raises(ValidationError) as exc:
        spec(command, launcher, gpus)
    return " ".join(error_messages(exc.value).values())


# --- the spec --------------------------------------------------------------------------------


def test_a_job_runs_its_command_as_it_is_unless_it_names_a_launcher():
    assert JobSpec.model_validate({**BASE, "command": "python t.py"}).launcher is None
    assert spec("python train.py --lr 2e-4", "torchrun").launcher == "torchrun"
    assert spec("train.py", "accelerate").launcher == "accelerate"
    assert "launcher" in error_messages(_invalid({"launcher": "deepspeed"}))


def _invalid(extra: dict) -> ValidationError:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**BASE, "command": "python t.py", **extra})
    return exc.value


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("torchrun --nproc_per_node=4 train.py", "nproc_per_node=4"),
        ("torchrun --standalone --nproc-per-node 4 train.py --lr 1", "nproc-per-node=4"),
        ("cd src && torchrun --nproc_per_node 4 train.py", "nproc_per_node=4"),
        ("python -m torch.distributed.run --nproc_per_node=4 train.py", "nproc_per_node=4"),
        ("accelerate launch --num_processes 4 train.py", "num_processes=4"),
        ("accelerate launch --num_processes=4 train.py", "num_processes=4"),
    ],
)
def test_a_launcher_line_whose_process_count_is_not_the_gpu_count_is_refused(command, flag):
    message = refusal(command, gpus=2)

    assert f"{flag} but requirements.num_gpus=2: make them equal" in message


@pytest.mark.parametrize(
    "command",
    [
        "torchrun --nproc_per_node=2 train.py",
        "torchrun --nproc-per-node 2 train.py",
        "torchrun --nproc_per_node=auto train.py",
        "torchrun --nproc_per_node gpu train.py",
        "accelerate launch --num_processes 2 train.py",
        "accelerate launch train.py",  # its config decides
        "python train.py --nproc_per_node=9",  # no launcher: a flag of the script's own
    ],
)
def test_a_launcher_line_that_fits_the_gpu_count_or_lets_the_launcher_count_is_taken(command):
    assert spec(command, gpus=2).command == command


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("torchrun --nproc_per_node=2 train.py", "command already starts torchrun"),
        ("accelerate launch train.py", "command already starts accelerate launch"),
        ("python -m torch.distributed.run train.py", "command already starts torchrun"),
        ("pip install x && python train.py", "without shell operators (&&)"),
        ("python train.py | tee log", "without shell operators (|)"),
        ("LR=1 python train.py", "not 'LR=1': put variables in env"),
        ("python 'train.py", "cannot be read as shell words"),
    ],
)
def test_a_launcher_with_a_command_it_cannot_wrap_is_refused_naming_both(command, says):
    message = refusal(command, "torchrun")

    assert message.startswith("Value error, launcher = 'torchrun': ")
    assert says in message


@pytest.mark.django_db
def test_a_submitted_launcher_is_stored_and_reaches_the_agent(cast, client):
    job = submit_spec(
        spec("python train.py", "torchrun", gpus=4),
        team=cast.team_a, created_by=cast.member, now=timezone.now(),
    )  # fmt: skip
    _, token = make_attempt(job)

    body = call(client, token, "register", {"agent_version": "0.1"}).json()

    assert (body["launcher"], body["num_gpus"]) == ("torchrun", 4)


@pytest.mark.django_db
def test_register_says_no_launcher_and_one_gpu_for_a_plain_job(client):
    _, token = make_attempt(JobFactory(requirements={}))

    body = call(client, token, "register", {"agent_version": "0.1"}).json()

    assert (body["launcher"], body["num_gpus"]) == (None, 1)


def test_the_portal_form_offers_the_launcher_and_refuses_a_mismatch_above_the_form():
    fields = {**BASE, "command": "train.py", "launcher": "accelerate", "num_gpus": "2"}
    form = JobForm(data=fields)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["spec"].launcher == "accelerate"

    form = JobForm(data={**fields, "command": "torchrun --nproc_per_node=8 t.py", "launcher": ""})
    assert not form.is_valid()
    assert "nproc_per_node=8 but requirements.num_gpus=2" in str(form.non_field_errors())


def test_a_failed_command_names_the_rank_in_the_jobs_failure_reason():
    words = exit_words("failed", 1, "rank 1 exited with code 1")

    assert words.failure_reason == "exit code 1: rank 1 exited with code 1"
    assert words.message == "the training command exited with 1: rank 1 exited with code 1"
    assert exit_words("failed", 1).failure_reason == "exit code 1"


# --- the agent's side ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "launcher", "wrapped"),
    [
        (
            "python train.py --out $NOMAD_CHECKPOINT_DIR",
            "torchrun",
            "exec python -m torch.distributed.run --standalone --nproc_per_node=2 "
            "train.py --out $NOMAD_CHECKPOINT_DIR",
        ),
        (
            "train.py 'a b'",
            "torchrun",
            "exec python3 -m torch.distributed.run --standalone --nproc_per_node=2 train.py 'a b'",
        ),
        (
            "/opt/conda/bin/python3.11 -m trainer.main --lr 1e-4",
            "accelerate",
            "exec /opt/conda/bin/python3.11 -m accelerate.commands.launch --num_machines 1 "
            "--num_processes 2 -m trainer.main --lr 1e-4",
        ),
    ],
)
def test_the_agent_wraps_the_script_in_its_launcher_with_one_process_per_gpu(
    command, launcher, wrapped
):
    assert launch.wrap_command(command, launcher, 2) == wrapped


def test_the_assignment_carries_the_launcher_and_the_gpu_count():
    reply = {"job_id": 1, "attempt_no": 1, "command": "python t.py"}

    plain = parse_assignment(reply)
    launched = parse_assignment({**reply, "launcher": "torchrun", "num_gpus": 8})

    assert (plain.launcher, plain.num_gpus) == (None, 1)  # an older server sends neither
    assert (launched.launcher, launched.num_gpus) == ("torchrun", 8)
    assert launched_command(plain, os.environ) == "python t.py"
    assert "--nproc_per_node=8 t.py" in launched_command(launched, os.environ)
    for bad in ({"launcher": "mpirun"}, {"num_gpus": 0}, {"num_gpus": "2"}):
        with pytest.raises(ValueError):
            parse_assignment({**reply, **bad})


def test_the_failed_rank_is_read_from_torchruns_summary_with_its_own_lines():
    failure = launch.failed_rank("loss 0.3\n" + SUMMARY)

    assert failure == launch.RankFailure(rank=1, local_rank=1, exitcode=1)
    assert failure.describe() == "rank 1 exited with code 1"
    assert launch.rank_lines(SUMMARY, failure) == SUMMARY.splitlines()[:3]
    assert launch.failed_rank("Traceback (most recent call last):\nValueError: x\n") is None
    killed = launch.failed_rank(SUMMARY.replace("exitcode  : 1 (pid", "exitcode  : -9 (pid"))
    assert killed.describe() == "rank 1 was killed by SIGKILL"


def test_the_processes_below_a_process_are_found_across_sessions(tmp_path):
    # A "launcher" whose rank runs in a session of its own, as torchrun starts ranks.
    script = "import subprocess, sys, time; subprocess.Popen(['sleep', '60'], start_new_session=True); time.sleep(60)"  # noqa: E501
    env = {**os.environ, "NOMAD_TEST_MARK": str(tmp_path)}
    launcher = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, env=env)
    try:
        found = wait_until(
            lambda: [p for p in procs.descendants(launcher.pid) if p != launcher.pid],
            timeout=10, what="the rank",
        )  # fmt: skip
        assert procs.other_groups(found, exclude=[launcher.pid]) == set(found)
        assert procs.with_env(found, "NOMAD_TEST_MARK", str(tmp_path)) == found  # inherited
        assert procs.with_env(found, "NOMAD_TEST_MARK", "another agent's") == []
    finally:
        for pid in procs.descendants(launcher.pid):
            os.kill(pid, 9)
        launcher.kill()
        launcher.wait()


def ranked(s3, *launcher_flags: str, **job) -> FakeSupervisor:
    command = shlex.join([sys.executable, str(LAUNCHER), *launcher_flags]) + " " + toy_command()
    return FakeSupervisor(s3, FakeJob(command=command, **job))


def rank_pid(run) -> int:
    found = wait_until(
        lambda: re.search(r"rank 0 is pid (\d+)", run.log()), timeout=30, what="the rank"
    )
    return int(found[1])


def test_a_checkpoint_request_reaches_a_rank_in_a_session_of_its_own(s3, tmp_path):
    supervisor = ranked(s3, env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "1000"})
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    try:
        wait_until(lambda: any(s >= 5 for s in steps_seen(attempt)), timeout=30, what="step 5")
        supervisor.command(attempt, "checkpoint_now")
        wait_until(lambda: supervisor.ready_checkpoints(attempt), timeout=30, what="a checkpoint")
        assert supervisor.ready_checkpoints(attempt)[0].step < 400

        supervisor.command(attempt, "stop")  # reaches the rank too: it saves and stops
        assert run.wait(30) != 0
        assert attempt.exit["reason"] == "stopped"
    finally:
        run.stop()
        supervisor.close()


def test_ranks_a_dead_launcher_left_behind_are_killed_when_the_command_ends(
    s3,
    tmp_path,
):
    supervisor = ranked(s3, "--leave", env={**FAST, "TOY_STEPS": "100000"})
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    try:
        pid = rank_pid(run)
        assert run.wait(30) == 0, run.log()  # the launcher exited at once
        wait_until(lambda: group_is_gone(pid), timeout=10, what="the left-behind rank to die")
    finally:
        run.stop()
        supervisor.close()


@pytest.mark.django_db
def test_the_job_page_says_which_launcher_runs_the_command_on_how_many_gpus(client, cast):
    client.force_login(cast.member)
    job = JobFactory(team=cast.team_a, launcher="torchrun", requirements={"num_gpus": 4})
    plain = JobFactory(team=cast.team_a)

    page = client.get(reverse("job-detail", args=[job.id])).content.decode()
    other = client.get(reverse("job-detail", args=[plain.id])).content.decode()

    assert "Run by <code>torchrun</code>, one process per GPU (4)" in page
    assert 'id="job-launcher"' not in other
