"""The real agent (a subprocess) against a live fake supervisor and a real S3 protocol server,
running the toy training script. Each test is one scenario from the agent's life."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import signal
from pathlib import Path

import pytest

from agent.build import build_zipapp
from agent.ckptcrypto import decrypt_stream
from agent.phases.command import exit_report
from tests.support.agent_fake_supervisor import (
    FakeJob,
    FakeSupervisor,
    start_agent,
    toy_command,
    wait_until,
)
from tests.support.agent_runs import group_is_gone, steps_seen, tar_members
from tests.support.toy import FAST

NET_DEV = (
    "Inter-|   Receive   |  Transmit\n face |bytes packets ...|bytes packets ...\n"
    "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
    "  eth0: {rx} 1 0 0 0 0 0 0 {tx} 1 0 0 0 0 0 0\n"
)


@pytest.fixture
def make_supervisor(s3):
    made: list[FakeSupervisor] = []

    def make(**job_fields) -> FakeSupervisor:
        job = FakeJob(command=toy_command(), **job_fields)
        supervisor = FakeSupervisor(s3, job)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        supervisor.close()


@pytest.fixture
def runs():
    started = []
    yield started
    for run in started:
        run.stop()


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory) -> Path:
    return build_zipapp(tmp_path_factory.mktemp("zipapp") / "agent.pyz")


def fake_nvidia_smi(directory: Path, body: str) -> dict[str, str]:
    """A stand-in nvidia-smi first on PATH; returns the env for the agent."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return {"PATH": f"{directory}{os.pathsep}{os.environ['PATH']}", "NOMAD_NVIDIA_SMI": ""}


def test_it_runs_the_command_heartbeats_and_uploads_checkpoints(
    make_supervisor, runs, s3, tmp_path
):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "40", "TOY_CHECKPOINT_EVERY": "10"}, total_steps=40
    )
    attempt = supervisor.new_attempt()
    env = fake_nvidia_smi(tmp_path / "bin", "echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9")
    run = start_agent(supervisor, attempt, tmp_path / "work", env=env)
    runs.append(run)

    assert run.wait(60) == 0, run.log()
    assert attempt.exit["reason"] == "finished"
    assert attempt.exit["exit_code"] == 0
    assert "done" in attempt.exit["log_tail"]
    gpu = attempt.heartbeats[0]["gpu"]  # the failing nvidia-smi, reported from the first beat
    assert gpu["ok"] is False
    assert "no driver" in gpu["error"]
    seqs = [h["seq"] for h in attempt.heartbeats]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    steps = steps_seen(attempt)
    assert steps == sorted(steps)
    assert steps[-1] == 40
    last = attempt.heartbeats[-1]
    assert last["total_steps"] == 40
    assert last["loss"] < 1.0
    assert last["seconds_per_step"] > 0
    assert last["phase"] == "exiting"
    assert {"running", "exiting"} <= {h["phase"] for h in attempt.heartbeats}
    assert last["received_at"] < attempt.exit["received_at"]
    gpu = attempt.heartbeats[-1]["gpu"]
    assert gpu["ok"] is False
    assert "no driver" in gpu["error"]

    ready = supervisor.ready_checkpoints(attempt)
    # The last checkpoint always arrives; earlier ones only if not superseded while pending.
    steps = [c.step for c in ready]
    assert steps[-1] == 40
    assert steps == sorted(set(steps))
    assert set(steps) <= {10, 20, 30, 40}
    for ckpt in ready:
        data = s3.get(ckpt.key)
        assert hashlib.sha256(data).hexdigest() == ckpt.sha256
        assert len(data) == ckpt.size
        files = tar_members(data)
        assert set(files) == {"state.json", "weights.bin"}
        assert json.loads(files["state.json"])["step"] == ckpt.step
        manifest = json.loads(s3.get(ckpt.key.rsplit("/", 1)[0] + "/manifest.json"))
        assert manifest["sha256"] == ckpt.sha256
    uploaded = sorted((tmp_path / "work" / "checkpoints").glob("*/NOMAD_UPLOADED"))
    assert len(uploaded) == len(steps)
    # Uploads run beside training: the first one completed while the command still ran.
    first_done = next(t for t, _, name, _ in supervisor.calls if name.endswith("/complete"))
    assert any(
        h["received_at"] > first_done and h["phase"] in ("running", "uploading")
        for h in attempt.heartbeats
    )
    assert "step 40/40" in (tmp_path / "work" / "logs" / "train.log").read_text()


# (checkpoint every N steps; the first attempt stops at 2N, the second at 3N). The 6 MB weights
# (over the 5 MiB part size: multipart) take the toy's pure-Python step about a second, so that
# run takes few steps; the small one needs 10 for the agent to upload each checkpoint it marks.
@pytest.mark.parametrize(
    ("encrypted", "weights_kb", "every"),
    [(False, 8, 10), (True, 6000, 3)],
    ids=["plain", "encrypted-multipart"],
)
def test_a_second_attempt_resumes_from_the_newest_checkpoint(
    make_supervisor, runs, s3, tmp_path, encrypted, weights_kb, every
):
    key = os.urandom(32) if encrypted else None
    supervisor = make_supervisor(
        env={
            **FAST,
            "TOY_STEPS": str(2 * every),
            "TOY_CHECKPOINT_EVERY": str(every),
            "TOY_WEIGHTS_KB": str(weights_kb),
        },
        data_key=key,
        part_size=5 * 1024 * 1024,
    )
    first = supervisor.new_attempt()
    run = start_agent(supervisor, first, tmp_path / "one")
    runs.append(run)
    assert run.wait(60) == 0, run.log()
    assert [c.step for c in supervisor.ready_checkpoints(first)] == [every, 2 * every]

    newest = supervisor.ready_checkpoints(first)[-1]
    data = s3.get(newest.key)
    assert hashlib.sha256(data).hexdigest() == newest.sha256
    if encrypted:
        assert newest.upload_id is not None
        assert data[:4] == b"NGCK"
        plain = io.BytesIO()
        decrypt_stream(io.BytesIO(data), plain, key)
        data = plain.getvalue()
    assert json.loads(tar_members(data)["state.json"])["step"] == 2 * every

    supervisor.job.env["TOY_STEPS"] = str(3 * every)
    second = supervisor.new_attempt()
    run = start_agent(supervisor, second, tmp_path / "two")
    runs.append(run)
    assert run.wait(60) == 0, run.log()

    assert f"resumed from step {2 * every}" in second.exit["log_tail"]
    assert min(steps_seen(second)) >= 2 * every + 1
    assert max(steps_seen(second)) == 3 * every
    assert [c.step for c in supervisor.ready_checkpoints(second)] == [3 * every]
    assert max(h["bytes_down"] for h in second.heartbeats) == newest.size


def test_a_restarted_container_resumes_from_the_checkpoint_on_its_disk_without_downloading(
    make_supervisor, runs, tmp_path
):
    # A host that rebooted and came back: the container restarts on the same disk (Vast
    # keeps it), so the checkpoint the script wrote and this agent uploaded is still there.
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "20", "TOY_CHECKPOINT_EVERY": "10", "TOY_WEIGHTS_KB": "64"}
    )
    first = supervisor.new_attempt()
    disk = tmp_path / "disk"
    run = start_agent(supervisor, first, disk)
    runs.append(run)
    assert run.wait(60) == 0, run.log()

    supervisor.job.env["TOY_STEPS"] = "30"
    again = supervisor.new_attempt()
    run = start_agent(supervisor, again, disk)
    runs.append(run)
    assert run.wait(60) == 0, run.log()

    assert "checkpoint step 20 is already on this disk" in run.log()
    assert "resumed from step 20" in again.exit["log_tail"]
    assert min(steps_seen(again)) > 20
    assert max(h["bytes_down"] for h in again.heartbeats) == 0  # nothing downloaded


def test_checkpoint_now_makes_the_script_save_one(make_supervisor, runs, tmp_path, zipapp):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "1000"}, stop_grace_s=10
    )
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work", zipapp=zipapp)
    runs.append(run)
    wait_until(lambda: any(s >= 5 for s in steps_seen(attempt)), timeout=30, what="step 5")

    supervisor.command(attempt, "checkpoint_now")
    wait_until(lambda: supervisor.ready_checkpoints(attempt), timeout=30, what="a checkpoint")
    assert supervisor.ready_checkpoints(attempt)[0].step < 400

    supervisor.command(attempt, "stop")
    assert run.wait(30) != 0


@pytest.mark.parametrize(
    ("sent", "seen"), [("auto", "auto"), ("script", "script"), (None, "script")]
)
def test_the_command_is_told_who_chooses_when_to_checkpoint(
    make_supervisor, runs, tmp_path, zipapp, sent, seen
):
    supervisor = make_supervisor(checkpoint_mode=sent)  # None: an older server's reply
    supervisor.job.command = 'echo "checkpoint mode: $NOMAD_CHECKPOINT_MODE"'
    attempt = supervisor.new_attempt()
    # What the agent itself inherited must not reach the command: register's reply decides.
    inherited = {"NOMAD_CHECKPOINT_MODE": "script" if seen == "auto" else "auto"}
    runs.append(start_agent(supervisor, attempt, tmp_path / "work", zipapp=zipapp, env=inherited))

    assert runs[-1].wait(30) == 0, runs[-1].log()
    assert f"checkpoint mode: {seen}" in attempt.exit["log_tail"]


def test_in_auto_mode_the_script_saves_only_when_asked_and_when_stopped(
    make_supervisor, runs, tmp_path
):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "5"},
        checkpoint_mode="auto",
        stop_grace_s=10,
    )
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    runs.append(run)
    checkpoints = tmp_path / "work" / "checkpoints"
    wait_until(lambda: any(s >= 12 for s in steps_seen(attempt)), timeout=30, what="step 12")
    # The toy saves before it reports the next step: steps 5 and 10 would be on disk by now.
    assert not list(checkpoints.glob("checkpoint-*"))

    supervisor.command(attempt, "checkpoint_now")
    wait_until(lambda: supervisor.ready_checkpoints(attempt), timeout=30, what="a checkpoint")
    (asked,) = supervisor.ready_checkpoints(attempt)
    supervisor.command(attempt, "stop")
    assert run.wait(30) != 0, run.log()

    steps = [c.step for c in supervisor.ready_checkpoints(attempt)]
    assert steps[0] == asked.step
    assert len(steps) == 2  # the one asked for and the one on stop, none on its own schedule
    assert len(list(checkpoints.glob("checkpoint-*"))) == 2


def test_heartbeats_report_the_containers_traffic_since_the_agent_started(
    make_supervisor, runs, tmp_path, zipapp
):
    counters = tmp_path / "net_dev"
    counters.write_text(NET_DEV.format(rx=50_000, tx=1_000))  # the bootstrap's, before us
    supervisor = make_supervisor()
    # The command "downloads" 7 MB and sends 25 kB: the interface counters move, as a
    # model download's would; the file is replaced whole, as the kernel's is read whole.
    moved = NET_DEV.format(rx=50_000 + 7_000_000, tx=1_000 + 25_000)
    supervisor.job.command = (
        f"sleep 0.5; printf '%s' {shlex.quote(moved)} > \"$NOMAD_NET_DEV.tmp\" && "
        'mv "$NOMAD_NET_DEV.tmp" "$NOMAD_NET_DEV"; sleep 0.5'
    )
    attempt = supervisor.new_attempt()
    env = {"NOMAD_NET_DEV": str(counters)}
    runs.append(start_agent(supervisor, attempt, tmp_path / "work", zipapp=zipapp, env=env))

    assert runs[-1].wait(30) == 0, runs[-1].log()
    first, last = attempt.heartbeats[0], attempt.heartbeats[-1]
    assert (first["net_rx_bytes"], first["net_tx_bytes"]) == (0, 0)
    assert (last["net_rx_bytes"], last["net_tx_bytes"]) == (7_000_000, 25_000)
    assert last["bytes_down"] == 0  # the agent itself downloaded nothing


def test_stop_ends_the_command_uploads_its_last_checkpoint_and_reports_stopped(
    make_supervisor, runs, tmp_path
):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "1000"}, stop_grace_s=10
    )
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    runs.append(run)
    child = run.child_pid()
    wait_until(lambda: any(s >= 3 for s in steps_seen(attempt)), timeout=30, what="step 3")

    supervisor.command(attempt, "stop")
    code = run.wait(30)

    assert code == 143  # the toy saves on SIGTERM and exits 128+15
    assert attempt.exit["reason"] == "stopped"
    assert attempt.exit["signal"] == signal.SIGTERM
    assert "stopped at step" in attempt.exit["log_tail"]
    assert group_is_gone(child)
    # The checkpoint written on SIGTERM went up before the exit was reported.
    (ckpt,) = supervisor.ready_checkpoints(attempt)
    assert ckpt.step < 400
    completes = [t for t, _, name, _ in supervisor.calls if name.endswith("/complete")]
    assert completes[-1] < supervisor.calls_of("exit")[0][0]


def test_a_terminated_agent_stops_the_command_and_still_reports(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "1000"}, stop_grace_s=10
    )
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    runs.append(run)
    child = run.child_pid()
    wait_until(lambda: any(s >= 3 for s in steps_seen(attempt)), timeout=30, what="step 3")

    run.proc.send_signal(signal.SIGTERM)  # the container is being shut down

    assert run.wait(30) == 143
    assert attempt.exit["reason"] == "killed"
    assert group_is_gone(child)
    assert len(supervisor.ready_checkpoints(attempt)) == 1  # the one saved on SIGTERM


def test_a_410_on_heartbeat_kills_the_command_and_uploads_nothing_more(
    make_supervisor, runs, tmp_path
):
    supervisor = make_supervisor(env={**FAST, "TOY_STEPS": "400", "TOY_CHECKPOINT_EVERY": "4"})
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "work")
    runs.append(run)
    child = run.child_pid()
    wait_until(lambda: supervisor.ready_checkpoints(attempt), timeout=30, what="a checkpoint")

    # Only heartbeats learn that the attempt is over; uploads would still be accepted.
    supervisor.fence(attempt, only="heartbeat")
    code = run.wait(30)

    assert code == 3
    assert group_is_gone(child)
    assert attempt.exit is None
    calls = supervisor.calls
    first_410 = next(i for i, (*_, name, status) in enumerate(calls) if status == 410)
    assert calls[first_410][2] == "heartbeat"
    accepted_after = [name for *_, name, status in calls[first_410:] if status == 200]
    assert len(accepted_after) <= 1, accepted_after  # at most one call already in flight
    assert "uploading nothing" in run.log()


def test_training_survives_the_supervisor_being_away(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(env={**FAST, "TOY_STEPS": "100", "TOY_CHECKPOINT_EVERY": "1000"})
    attempt = supervisor.new_attempt()
    env = fake_nvidia_smi(tmp_path / "bin", "sleep 60")  # a hung driver, on top
    env["NOMAD_NVIDIA_SMI_TIMEOUT_S"] = "0.3"
    run = start_agent(supervisor, attempt, tmp_path / "work", env=env)
    runs.append(run)
    wait_until(lambda: any(s >= 3 for s in steps_seen(attempt)), timeout=30, what="step 3")

    supervisor.pause()
    progress = tmp_path / "work" / "progress.json"
    away_from = json.loads(progress.read_text())["step"]
    wait_until(
        lambda: json.loads(progress.read_text())["step"] >= away_from + 20,
        timeout=30,
        what="training to go on while the supervisor is away",
    )
    assert run.proc.poll() is None
    supervisor.resume()

    assert run.wait(60) == 0, run.log()
    assert attempt.exit["reason"] == "finished"
    steps = steps_seen(attempt)
    assert any(s >= away_from + 20 for s in steps)
    assert steps[-1] == 100
    seqs = [h["seq"] for h in attempt.heartbeats]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert "not delivered" in run.log()
    gpu = attempt.heartbeats[-1]["gpu"]
    assert gpu["ok"] is False
    assert "did not answer" in gpu["error"]
    assert [c.step for c in supervisor.ready_checkpoints(attempt)] == [100]


def test_a_job_with_two_gpus_on_a_host_showing_one_reports_the_gpu_fault(
    make_supervisor, runs, tmp_path
):
    supervisor = make_supervisor(
        env={**FAST, "TOY_STEPS": "20", "TOY_CHECKPOINT_EVERY": "10"}, total_steps=20, num_gpus=2
    )
    attempt = supervisor.new_attempt()
    one_gpu = "echo '0, 00000000:01:00.0, NVIDIA GeForce RTX 4090, 90, 2000, 24564, 60, [N/A]'"
    run = start_agent(
        supervisor, attempt, tmp_path / "work", env=fake_nvidia_smi(tmp_path / "bin", one_gpu)
    )
    runs.append(run)

    assert run.wait(60) == 0, run.log()
    gpu = attempt.heartbeats[-1]["gpu"]
    assert gpu["ok"] is False
    assert gpu["error"] == "a GPU is missing: nvidia-smi lists 1 of the job's 2 GPUs"
    assert [(g["index"], g["utilization_pct"]) for g in gpu["gpus"]] == [(0, 90.0)]


def test_a_corrupt_resume_checkpoint_is_an_agent_error_not_a_run(
    make_supervisor, runs, s3, tmp_path
):
    supervisor = make_supervisor(env={**FAST, "TOY_STEPS": "10", "TOY_CHECKPOINT_EVERY": "10"})
    first = supervisor.new_attempt()
    run = start_agent(supervisor, first, tmp_path / "one")
    runs.append(run)
    assert run.wait(60) == 0, run.log()
    (ckpt,) = supervisor.ready_checkpoints(first)
    data = bytearray(s3.get(ckpt.key))
    data[700] ^= 1
    s3.client.put_object(Bucket=s3.bucket, Key=ckpt.key, Body=bytes(data))

    second = supervisor.new_attempt()
    run = start_agent(supervisor, second, tmp_path / "two")
    runs.append(run)

    assert run.wait(60) == 4
    assert second.exit["reason"] == "agent_error"
    assert "sha256" in second.exit["error"]
    assert "started command" not in run.log()


@pytest.mark.parametrize(
    ("returncode", "stopped", "terminated", "expected"),
    [
        (0, False, False, (0, None, "finished")),
        (1, False, False, (1, None, "failed")),
        (-9, False, False, (None, 9, "killed")),
        (137, False, False, (137, 9, "killed")),  # a shell reporting SIGKILL of its child
        (143, True, False, (143, 15, "stopped")),
        (0, False, True, (0, None, "killed")),
        (200, False, False, (200, None, "failed")),  # 128+72: no such signal
    ],
)
def test_exit_reports_read_codes_and_signals(returncode, stopped, terminated, expected):
    report = exit_report(returncode, stopped=stopped, terminated=terminated)
    assert (report["exit_code"], report["signal"], report["reason"]) == expected
