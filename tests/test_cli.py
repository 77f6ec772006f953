"""The ``nomadgpu`` CLI against a live server: real HTTP, real tokens, the real database.

Commands that return at once run in-process (``main(argv)``); the followers run as
``python -m nomadgpu_cli`` subprocesses whose output is read while the test moves the job on.
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from billing.models import TeamBudget
from jobs import lifecycle
from jobs.models import Attempt, Job, JobState
from nomadgpu import api_tokens
from nomadgpu_cli import cli, render
from tests.support.cli import Follower
from tests.support.factories import InterruptionFactory, JobFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.s3 import free_port

pytestmark = pytest.mark.django_db(transaction=True)

JOB_TOML = """
name = "cli-sft"
image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
command = "python train.py"
total_steps = 300

[env]
LR = "2e-4"

[requirements]
gpu_names = ["RTX 4090"]
"""


@pytest.fixture
def token(cast) -> str:
    return api_tokens.create_token(user=cast.member, name="cli", now=timezone.now())[1]


@pytest.fixture
def run(live_server, token, capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""

    def run(*argv: str, token: str = token) -> tuple[int, str, str]:
        code = cli.main(["--url", live_server.url, "--token", token, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(JOB_TOML)
    return path


def move(job: Job, to: str, kind: str, **fields) -> None:
    """The state machine's own transition, as the supervisor would make it."""
    with transaction.atomic():
        lifecycle.transition(job.pk, to, now=timezone.now(), kind=kind, **fields)


def host_starts_training(job: Job) -> Attempt:
    """What renting and the agent's first heartbeats do to the job's attempt, in short."""
    attempt = wait_until(lambda: job.attempts.first(), timeout=10, what="the attempt to be planned")
    now = timezone.now()
    Attempt.objects.filter(pk=attempt.pk).update(
        state="starting", instance_id=9001, gpu_name="RTX 4090", dph_base=0.4, rented_at=now
    )
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "renting", timeout=10, what="renting")
    move(job, JobState.STARTING, "rented", message="instance 9001")
    Attempt.objects.filter(pk=attempt.pk).update(state="running", registered_at=now)
    move(job, JobState.RUNNING, "running", message="training started")
    return attempt


# ---- commands that return at once ---------------------------------------------------------------


def test_submit_sends_the_toml_file_and_prints_the_job(run, job_file, cast):
    code, out, _ = run("submit", str(job_file))

    job = Job.objects.get()
    assert code == 0
    assert out.startswith(f"submitted job {job.pk} (cli-sft) to team-a:")
    assert (job.team, job.created_by, job.env) == (cast.team_a, cast.member, {"LR": "2e-4"})


def test_submit_template_uses_the_servers_spec(run):
    code, out, _ = run("submit", "--template", "toy")

    job = Job.objects.get()
    assert code == 0
    assert out.startswith(f"submitted job {job.pk} (toy) to team-a:")
    assert job.command.endswith("examples/toy/train.py")  # resolved by the server
    assert job.total_steps == 300


def test_submit_of_an_unknown_template_says_which_exist(run):
    code, _, err = run("submit", "--template", "nope")

    assert code == cli.EXIT_REFUSED
    assert "toy, qlora" in err
    assert not Job.objects.exists()


def test_submit_lists_the_fields_the_server_refused(run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(JOB_TOML.replace('gpu_names = ["RTX 4090"]', "num_gpus = 0\nmin_reliabilty = 1"))

    code, _, err = run("submit", str(bad))

    assert code == cli.EXIT_REFUSED
    assert "  requirements.num_gpus: Input should be greater than or equal to 1" in err
    assert "  requirements.min_reliabilty: Extra inputs are not permitted" in err
    assert not Job.objects.exists()


def test_submit_refused_by_a_limit_prints_what_can_be_done(run, tmp_path, cast):
    noon = datetime(2026, 11, 4, 12, tzinfo=UTC)
    TeamBudget.objects.create(team=cast.team_a, daily_usd=Decimal("1.00"))
    spent = JobFactory(team=cast.team_a, state="running", created_at=noon - timedelta(hours=1))
    since = noon - timedelta(minutes=30)  # $0.720 of today's $1.00
    make_attempt(spent, state="running", dph_base=1.44, rented_at=since, registered_at=since)
    big = tmp_path / "big.toml"  # 900 steps of 4 s on the reference $0.40/h GPU: about $0.41
    big.write_text(
        JOB_TOML.replace("total_steps = 300", "total_steps = 900")
        + "\n[profile]\nimage_gb = 3.0\nmodel_gb = 0.0\nupload_gb = 0.0\n"
    )

    with time_machine.travel(noon, tick=True):
        code, _, err = run("submit", str(big))

    assert code == cli.EXIT_REFUSED
    assert err.startswith("nomadgpu: 409: Refused: estimated cost $0.")
    assert "would cross the daily limit $1.00: $0.720 spent. What you can do: wait until " in err
    assert "the daily limit starts again at 00:00 on Thu 5 Nov (UTC), in 12 h; " in err
    assert "ask a team admin (alice) to raise it; " in err
    assert 'or submit with "Wait for budget"' in err
    assert "start_when_budget_allows = true in a job file or the API" in err
    assert not Job.objects.filter(name="cli-sft").exists()


def test_submit_sends_the_stage_entries_of_the_toml_file(run, tmp_path):
    staged = tmp_path / "staged.toml"
    staged.write_text(
        JOB_TOML
        + '\n[[stage]]\nhf = "Qwen/Qwen2.5-7B-Instruct"\nfiles = ["*.json"]\n'
        + '\n[[stage]]\nurl = "https://example.org/train.jsonl"\npath = "data/train.jsonl"\n'
    )

    code, _, err = run("submit", str(staged))

    job = Job.objects.get()
    assert code == 0, err
    assert job.stage == [
        {"hf": "Qwen/Qwen2.5-7B-Instruct", "revision": "main", "files": ["*.json"]},
        {"url": "https://example.org/train.jsonl", "path": "data/train.jsonl"},
    ]
    assert job.stage_state == "staging"  # the worker mirrors it before any rent


def test_submit_names_a_malformed_stage_entry(run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('stage = [{hf = "Qwen", revision = ""}]\n' + JOB_TOML)

    code, _, err = run("submit", str(bad))

    assert code == cli.EXIT_REFUSED
    assert "stage.0.hf.hf: Value error, 'Qwen' is not a Hugging Face repo id (ORG/NAME)" in err
    assert not Job.objects.exists()


def test_submit_of_a_broken_file_says_why_without_calling_the_server(run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "unterminated')

    code, _, err = run("submit", str(bad))

    assert code == cli.EXIT_REFUSED
    assert "is not valid TOML" in err


def test_status_lists_the_teams_jobs_and_shows_one(run, cast):
    job = JobFactory(team=cast.team_a, name="llama-sft", total_steps=300, state="running")
    make_attempt(job, state="running", instance_id=77, gpu_name="RTX 4090", step=150)
    JobFactory(team=cast.team_b, name="theirs")

    code, listing, _ = run("status")
    _, detail, _ = run("status", str(job.pk))

    assert code == 0
    assert "llama-sft" in listing
    assert "150/300" in listing
    assert "theirs" not in listing
    assert "150/300  50%" in detail
    assert "RTX 4090 instance 77" in detail


def test_status_prints_the_loss_as_the_job_page_does(run, client, cast):
    job = JobFactory(team=cast.team_a, name="tiny-loss", total_steps=300, state="running")
    make_attempt(job, state="running", instance_id=78, step=150, loss=1.351361815509973e-05)
    client.force_login(cast.member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()

    _, detail, _ = run("status", str(job.pk))

    assert "          loss: 1.351e-05" in detail.splitlines()
    assert '<span class="num" id="job-loss">1.351e-05</span>' in page


def test_status_says_how_the_step_resumed_from_compares_with_the_step_reached(run, cast):
    job = JobFactory(team=cast.team_a, name="drilled", total_steps=300, state="running")
    lost, _ = make_attempt(job, state="ended", instance_id=80, step=48)
    make_attempt(job, number=2, state="running", instance_id=81, step=55)
    InterruptionFactory(
        attempt=lost, cause="provider_gone", detected_at=timezone.now(),
        running_again_at=timezone.now(), step_reached=48, resumed_step=50,
    )  # fmt: skip

    _, detail, _ = run("status", str(job.pk))

    assert (
        "resumed from step 50; checkpoint 50 was written after the last heartbeat, which "
        "reported step 48: no work lost" in detail
    )


def test_status_of_another_teams_job_is_refused_as_not_found(run, cast):
    theirs = JobFactory(team=cast.team_b)

    code, _, err = run("status", str(theirs.pk))

    assert code == cli.EXIT_REFUSED
    assert "404" in err


def test_logs_prints_the_tail(run, cast):
    job = JobFactory(team=cast.team_a)
    make_attempt(job, state="running", log_tail="step 1 loss 0.9\nstep 2 loss 0.8")

    code, out, _ = run("logs", str(job.pk))

    assert code == 0
    assert out.splitlines() == ["step 1 loss 0.9", "step 2 loss 0.8"]


def test_cancel_cancels_and_a_second_cancel_is_refused(run, cast):
    job = JobFactory(team=cast.team_a)

    first = run("cancel", str(job.pk))
    second = run("cancel", str(job.pk))

    job.refresh_from_db()
    assert job.state == "cancelled"
    assert first[:2] == (0, f"job {job.pk} cancelled\n")
    assert second[0] == cli.EXIT_REFUSED
    assert "409" in second[2]


def test_a_revoked_token_exits_with_the_auth_code(run, cast):
    row, token = api_tokens.create_token(user=cast.member, name="old", now=timezone.now())
    api_tokens.revoke_token(user=cast.member, token_id=row.pk, now=timezone.now())

    code, _, err = run("status", token=token)

    assert code == cli.EXIT_AUTH
    assert "did not accept the token" in err


def test_an_unreachable_server_exits_4(token, capsys):
    code = cli.main(["--url", f"http://127.0.0.1:{free_port()}", "--token", token, "status"])

    assert code == cli.EXIT_UNREACHABLE
    assert "cannot reach" in capsys.readouterr().err


# ---- followers --------------------------------------------------------------------------------


def test_submit_follow_shows_progress_and_events_and_exits_0_on_success(
    live_server, token, job_file
):
    follower = Follower(live_server.url, token, "submit", str(job_file), "--follow")
    follower.wait_for("submitted job")
    job = Job.objects.get()
    attempt = host_starts_training(job)
    follower.wait_for("training started")

    Attempt.objects.filter(pk=attempt.pk).update(step=150, total_steps=300, seconds_per_step=0.5)
    follower.wait_for("150/300")
    Attempt.objects.filter(pk=attempt.pk).update(state="ended", step=300, ended_at=timezone.now())
    move(job, JobState.SUCCEEDED, "finished", message="exit 0", final_step=300)

    assert follower.finish() == 0
    out = follower.output
    assert "[###############...............] 150/300  50%  ETA 1 min 15 s  running" in out
    assert "300/300 100%" in out
    kinds = [m[1] for m in re.finditer(r"^\d\d:\d\d:\d\d (\w+)", out, re.MULTILINE)]
    assert kinds == ["submitted", "renting", "rented", "running", "finished"]
    assert out.splitlines()[-1].startswith(f"job {job.pk} succeeded")


def test_submit_follow_exits_1_when_the_job_is_cancelled(live_server, token, job_file, run):
    follower = Follower(live_server.url, token, "submit", str(job_file), "--follow")
    follower.wait_for("submitted job")
    job = Job.objects.get()

    assert run("cancel", str(job.pk))[0] == 0

    assert follower.finish() == cli.EXIT_JOB_FAILED
    assert "cancelled" in follower.lines[-1]


def test_logs_follow_prints_new_lines_as_they_arrive_until_the_job_ends(live_server, token, cast):
    job = JobFactory(team=cast.team_a, state="running")
    attempt, _ = make_attempt(job, state="running", log_tail="step 1")
    follower = Follower(live_server.url, token, "logs", str(job.pk), "-f")

    Attempt.objects.filter(pk=attempt.pk).update(log_tail="step 1\nstep 2\nstep 3")
    follower.wait_for("step 2")
    Attempt.objects.filter(pk=attempt.pk).update(log_tail="step 2\nstep 3\nstep 4\ndone")
    follower.wait_for("step 3")
    Attempt.objects.filter(pk=attempt.pk).update(state="ended")
    move(job, JobState.SUCCEEDED, "finished")

    assert follower.finish() == 0
    assert follower.lines == ["step 1", "step 2", "step 3", "step 4", "done"]


def test_logs_follow_marks_a_host_that_changed_between_two_polls(live_server, token, cast):
    job = JobFactory(team=cast.team_a, state="running")
    first, _ = make_attempt(job, state="running", log_tail="a1 line 1\na1 line 2\na1 line 3")
    follower = Follower(live_server.url, token, "logs", str(job.pk), "-f")
    follower.wait_for("a1 line 2")
    Attempt.objects.filter(pk=first.pk).update(state="ended")  # its last line settles
    follower.wait_for("a1 line 3")

    # Its replacement logs: the next poll's lines are all the new host's, and the marker must
    # still come first (it used to be printed only for a change inside one poll's lines).
    make_attempt(job, number=2, state="running", log_tail="a2 line 1\na2 line 2\na2 line 3")
    follower.wait_for("a2 line 2")
    Attempt.objects.filter(job=job).update(state="ended")
    move(job, JobState.SUCCEEDED, "finished")

    assert follower.finish() == 0
    assert follower.lines == [
        "a1 line 1",
        "a1 line 2",
        "a1 line 3",
        "[nomadgpu] --- host of attempt 2 ---",
        "a2 line 1",
        "a2 line 2",
        "a2 line 3",
    ]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_progress_line_is_redrawn_in_place_under_the_events():
    screen = render.Screen(FakeTerminal())
    job = {"state": "running", "step": 150, "total_steps": 300, "progress": 0.5, "eta_s": 75}

    screen.progress(render.progress_bar(job))
    screen.line("12:00:00 host_lost")
    screen.progress(render.progress_bar({**job, "step": 151, "progress": 151 / 300}))
    screen.done()

    bar = "[###############...............] 150/300  50%  ETA 1 min 15 s  running"
    assert screen.stream.getvalue() == (
        f"\r\033[K{bar}"
        f"\r\033[K12:00:00 host_lost\n{bar}"
        "\r\033[K[###############...............] 151/300  50%  ETA 1 min 15 s  running\n"
    )
