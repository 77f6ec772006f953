"""The job's own code, setup and secrets (PROTOCOL.md §5, "Code, setup and secrets"): the real
agent (a subprocess) against the live fake supervisor, code packs in a real S3 protocol server
and git repositories made with the git CLI."""

from __future__ import annotations

import io
import os
import shlex
import sys
import tarfile
from pathlib import Path

import pytest

from agent.checkpoints import UnsafeArchive
from agent.workdir import extract_code
from tests.support.agent_fake_supervisor import (
    FakeJob,
    FakeSupervisor,
    code_pack,
    git_repository,
    start_agent,
    wait_until,
)

SECRET = "hf_Sup3rSecretValue42"
PY = shlex.quote(sys.executable)
# The command of most tests: it runs the code's own script from the work directory.
RUN_CODE = f"{PY} train.py"
TRAIN = """\
import os, pathlib
here = pathlib.Path.cwd()
assert str(here) == os.environ["NOMAD_WORKDIR"], (here, os.environ["NOMAD_WORKDIR"])
print("code says:", pathlib.Path("lib/message.txt").read_text().strip())
print("setup left:", pathlib.Path("setup-marker").read_text().strip())
"""


@pytest.fixture
def make_supervisor(s3):
    made: list[FakeSupervisor] = []

    def make(command: str = RUN_CODE, **job_fields) -> FakeSupervisor:
        supervisor = FakeSupervisor(s3, FakeJob(command=command, **job_fields))
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


def run_to_the_end(supervisor, runs, workdir: Path, *, env=None, timeout=60):
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, workdir, env=env)
    runs.append(run)
    code = run.wait(timeout)
    assert attempt.exit is not None, run.log()
    return attempt, run, code


def every_tail(attempt) -> list[str]:
    return [h["log_tail"] for h in attempt.heartbeats] + [attempt.exit["log_tail"]]


def boundaries(attempt) -> dict[str, float]:
    """Each phase boundary as a moment on the test's clock (the call's arrival minus its age)."""
    moments: dict[str, float] = {}
    for beat in attempt.heartbeats:
        for name, age in (beat.get("phases") or {}).items():
            moments.setdefault(name, beat["received_at"] - age)
    return moments


def evil_pack(member: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        good = tarfile.TarInfo("train.py")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"1\n"))
        member.size = len(data) if member.isreg() else 0
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


# --- code -------------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_the_code_arrives_from_an_archive_and_setup_prepares_it(
    make_supervisor, runs, s3, tmp_path, encrypted
):
    supervisor = make_supervisor(setup="echo from-setup > setup-marker\n./tools/check.sh")
    files = {
        "train.py": TRAIN,
        "lib/message.txt": "hello from the pack\n",
        "tools/check.sh": "#!/bin/sh\necho check ran\n",
    }
    key = supervisor.store_code_pack(
        code_pack(files, modes={"tools/check.sh": 0o755}), encrypted=encrypted
    )
    if encrypted:
        assert s3.get(key)[:4] == b"NGCK"  # the bucket never holds the plaintext

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 0, run.log()
    assert attempt.exit["reason"] == "finished"
    tail = attempt.exit["log_tail"]
    assert "check ran" in tail  # the setup's own output, in the same tail
    assert "code says: hello from the pack" in tail
    assert "setup left: from-setup" in tail
    work = tmp_path / "agent" / "work"
    assert (work / "lib" / "message.txt").read_text() == "hello from the pack\n"
    assert os.access(work / "tools" / "check.sh", os.X_OK)
    assert max(h["bytes_down"] for h in attempt.heartbeats) == supervisor.job.workdir["size"]
    moments = boundaries(attempt)
    # Reported by different heartbeats, each measured from its own call: allow their latency.
    assert moments["workdir_ready"] <= moments["setup_done"] + 0.05
    assert moments["setup_done"] <= moments["command_started"] + 0.05


def test_the_code_arrives_from_git_at_exactly_the_commit(make_supervisor, runs, tmp_path):
    url, (first, second) = git_repository(
        tmp_path / "repo.git",
        [{"train.py": "print('version one')\n"}, {"train.py": "print('version two')\n"}],
    )
    supervisor = make_supervisor(command=f"git rev-parse HEAD; {RUN_CODE}")
    supervisor.use_git(url, first)  # not the branch's tip

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 0, run.log()
    tail = attempt.exit["log_tail"]
    assert first in tail
    assert "version one" in tail
    assert "version two" not in tail
    assert second not in tail


def test_a_deploy_key_reaches_ssh_in_a_private_file_deleted_afterwards(
    make_supervisor, runs, tmp_path
):
    url, (commit,) = git_repository(tmp_path / "repo.git", [{"train.py": "print('private')\n"}])
    seen = tmp_path / "ssh-saw"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # An ssh stand-in: it notes how it was called, then runs the remote git command locally.
    (bin_dir / "ssh").write_text(
        "#!/bin/sh\n"
        f'seen={shlex.quote(str(seen))}; echo "$@" > "$seen.args"\n'
        'while [ $# -gt 1 ]; do [ "$1" = -i ] && key=$2; shift; done\n'
        'stat -c %a "$key" > "$seen.mode"; echo "$key" > "$seen.path"; cat "$key" > "$seen.key"\n'
        'exec sh -c "$1"\n'
    )
    (bin_dir / "ssh").chmod(0o755)
    supervisor = make_supervisor()
    ssh_url = "ssh://git@example.invalid" + url.removeprefix("file://")
    supervisor.use_git(ssh_url, commit, ssh_key="-----BEGIN KEY-----\nabc\n-----END KEY-----")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent", env=env)

    assert code == 0, run.log()
    assert "private" in attempt.exit["log_tail"]
    args = Path(f"{seen}.args").read_text()
    assert "-o IdentitiesOnly=yes" in args
    assert "-o StrictHostKeyChecking=accept-new" in args
    assert Path(f"{seen}.mode").read_text().strip() == "600"
    assert Path(f"{seen}.key").read_text() == "-----BEGIN KEY-----\nabc\n-----END KEY-----\n"
    assert not Path(Path(f"{seen}.path").read_text().strip()).exists()


def test_a_clone_that_fails_is_the_jobs_own_error(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(command="touch ran")
    supervisor.use_git((tmp_path / "no-such-repo.git").as_uri(), "a" * 40)

    attempt, _, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 5
    assert attempt.exit["reason"] == "setup_failed"
    assert "git fetch of commit" in attempt.exit["error"]
    assert "no-such-repo" in attempt.exit["log_tail"]  # git's own words
    assert not (tmp_path / "agent" / "work" / "ran").exists()


def test_an_image_without_git_is_told_so(make_supervisor, runs, tmp_path):
    url, (commit,) = git_repository(tmp_path / "repo.git", [{"train.py": "print(1)\n"}])
    supervisor = make_supervisor()
    supervisor.use_git(url, commit)
    bin_dir = tmp_path / "bin"  # a PATH with a shell and nothing else
    bin_dir.mkdir()
    for tool in ("bash", "sh"):
        (bin_dir / tool).symlink_to(Path(f"/bin/{tool}").resolve())

    attempt, _, code = run_to_the_end(
        supervisor, runs, tmp_path / "agent", env={"PATH": str(bin_dir)}
    )

    assert code == 5
    assert attempt.exit["reason"] == "setup_failed"
    assert "git is not installed" in attempt.exit["error"]


@pytest.mark.parametrize(
    "bad",
    [
        member("../outside.txt"),
        member("/nomad-test-absolute.txt"),
        member("escape", tarfile.SYMTYPE, "../.."),
        member("etc-passwd", tarfile.SYMTYPE, "/etc/passwd"),
        member("null", tarfile.CHRTYPE),
        member("pipe", tarfile.FIFOTYPE),
    ],
    ids=["dotdot", "absolute", "link-out", "absolute-link", "device", "fifo"],
)
def test_an_unsafe_archive_is_refused(make_supervisor, runs, tmp_path, bad):
    supervisor = make_supervisor(command="touch ran")
    supervisor.store_code_pack(evil_pack(bad))

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 5, run.log()
    assert attempt.exit["reason"] == "setup_failed"
    assert "code archive" in attempt.exit["error"]
    assert not (tmp_path / "agent" / "outside.txt").exists()
    assert not Path("/nomad-test-absolute.txt").exists()
    assert not (tmp_path / "agent" / "work").exists()  # nothing of it is put in place
    assert "started command" not in run.log()


def test_a_pack_whose_sha256_does_not_match_is_an_agent_error(make_supervisor, runs, s3, tmp_path):
    supervisor = make_supervisor(command="touch ran")
    key = supervisor.store_code_pack(code_pack({"train.py": "print(1)\n"}))
    damaged = bytearray(s3.get(key))
    damaged[20] ^= 1  # the host's download went wrong: same size, other bytes
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(damaged))

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 4
    assert attempt.exit["reason"] == "agent_error"
    assert "sha256" in attempt.exit["error"]
    assert run.log().count("code archive download failed") == 2  # tried three times
    assert "started command" not in run.log()


# --- setup --------------------------------------------------------------------------------------


def test_without_code_setup_and_command_run_in_the_scratch_folder(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(
        command='test "$PWD" = "$NOMAD_WORKDIR" && echo "command read: $(cat marker)"',
        setup="echo written-by-setup > marker",
    )

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 0, run.log()
    assert "command read: written-by-setup" in attempt.exit["log_tail"]
    assert (tmp_path / "agent" / "marker").exists()
    assert {"workdir_ready", "setup_done"} <= set(boundaries(attempt))


def test_a_failing_setup_reports_its_log_and_the_command_never_runs(
    make_supervisor, runs, tmp_path
):
    supervisor = make_supervisor(
        command="touch ran",
        setup="echo installing requirements\necho 'no such package: torchh' >&2\nexit 3\n"
        "echo never",
    )

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 5
    report = attempt.exit
    assert (report["reason"], report["exit_code"]) == ("setup_failed", 3)
    assert "installing requirements" in report["log_tail"]
    assert "no such package: torchh" in report["log_tail"]
    assert "never" not in report["log_tail"]
    assert "setup exited with code 3" in report["error"]
    assert not (tmp_path / "agent" / "ran").exists()
    assert "started command" not in run.log()


def test_setup_runs_with_bash_e_so_the_first_failing_line_ends_it(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(command="true", setup="false\necho went-on > went-on")

    attempt, _, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert (attempt.exit["reason"], code) == ("setup_failed", 5)
    assert not (tmp_path / "agent" / "went-on").exists()


def test_setup_is_skipped_when_the_agent_restarts_in_the_same_container(
    make_supervisor, runs, tmp_path
):
    count, go = tmp_path / "setup-runs", tmp_path / "go"
    supervisor = make_supervisor(
        command=f'echo "setup ran $(wc -l < {count}) time(s)"; test -e {go} || sleep 60',
        setup=f"echo ran >> {count}\necho from-setup > setup-marker",
    )
    supervisor.store_code_pack(code_pack({"train.py": TRAIN, "lib/message.txt": "hi\n"}))
    attempt = supervisor.new_attempt()
    first = start_agent(supervisor, attempt, tmp_path / "agent")
    runs.append(first)
    first.child_pid()
    first.stop()  # the container restarts: agent and command die, the disk stays
    go.touch()

    second = start_agent(supervisor, attempt, tmp_path / "agent")  # the same attempt's token
    runs.append(second)

    assert second.wait(60) == 0, second.log()
    assert count.read_text() == "ran\n"
    assert "setup ran 1 time(s)" in attempt.exit["log_tail"]
    assert "setup already ran in this container" in second.log()
    assert "the code is already in" in second.log()
    assert (tmp_path / "agent" / "work" / "setup-marker").exists()  # the code was not replaced


def test_stop_during_setup_ends_it_and_the_command_never_runs(make_supervisor, runs, tmp_path):
    supervisor = make_supervisor(command="touch ran", setup="echo setting up; sleep 60")
    attempt = supervisor.new_attempt()
    run = start_agent(supervisor, attempt, tmp_path / "agent")
    runs.append(run)
    wait_until(
        lambda: any("setting up" in h["log_tail"] for h in attempt.heartbeats),
        timeout=30,
        what="setup to start",
    )

    supervisor.command(attempt, "stop")

    assert run.wait(30) == 143
    assert attempt.exit["reason"] == "stopped"
    assert not (tmp_path / "agent" / "ran").exists()


# --- secrets ------------------------------------------------------------------------------------

# The secret goes out in two writes with a pause between them: the agent reads it in two
# chunks, as a value that straddles a pipe read would arrive.
PRINT_SECRET = (
    "import os, sys, time\n"
    f"assert os.environ['HF_TOKEN'] == {SECRET!r}\n"
    "print('token ok', flush=True)\n"
    "value = os.environ['HF_TOKEN']\n"
    "sys.stdout.write('split: ' + value[:7]); sys.stdout.flush(); time.sleep(0.5)\n"
    "sys.stdout.write(value[7:] + ' end\\n'); sys.stdout.flush()\n"
    "print('short:', os.environ['SHORT'])\n"
)


def test_a_secret_reaches_setup_and_command_and_never_leaves_the_agent(
    make_supervisor, runs, tmp_path
):
    script = tmp_path / "print_secret.py"
    script.write_text(PRINT_SECRET)
    supervisor = make_supervisor(
        # The value written out in the command itself: the agent logs the command it starts.
        command=f"EXPECTED={SECRET} {PY} {script}",
        setup='echo "setup sees $HF_TOKEN"',
        secrets={"HF_TOKEN": SECRET, "SHORT": "abc"},
    )

    attempt, run, code = run_to_the_end(supervisor, runs, tmp_path / "agent")

    assert code == 0, run.log()
    tail = attempt.exit["log_tail"]
    assert "token ok" in tail
    assert "setup sees ***" in tail
    assert "split: *** end" in tail
    assert "short: abc" in tail  # under 4 characters: not masked
    for text in [*every_tail(attempt), run.log(), train_log(tmp_path / "agent")]:
        assert SECRET not in text
        assert SECRET[:7] + "\n" not in text  # nor its first half on a line of its own
    assert f"EXPECTED=*** {PY}" in run.log()  # the agent's own line, masked


def train_log(scratch: Path) -> str:
    return (scratch / "logs" / "train.log").read_text()


# --- the unpacking rules, directly ---------------------------------------------------------------


def unpack(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    dest = tmp_path / "dest"
    dest.mkdir()
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r|") as tar:
        extract_code(tar, dest)
    return dest


def test_links_that_stay_inside_the_folder_are_kept(tmp_path):
    dest = unpack(
        tmp_path,
        [
            (member("lib/a.txt"), b"alpha"),
            (member("same", tarfile.LNKTYPE, "lib/a.txt"), b""),
            (member("to-a", tarfile.SYMTYPE, "lib/a.txt"), b""),
            (member("lib/up", tarfile.SYMTYPE, "../to-a"), b""),
            (member("libs", tarfile.SYMTYPE, "lib"), b""),
        ],
    )
    assert (dest / "same").read_bytes() == b"alpha"
    assert (dest / "same").stat().st_ino == (dest / "lib" / "a.txt").stat().st_ino
    assert (dest / "lib" / "up").read_bytes() == b"alpha"
    assert (dest / "libs" / "a.txt").read_bytes() == b"alpha"


@pytest.mark.parametrize(
    "members",
    [
        # Each link alone resolves inside; together they lead out of the folder.
        [member("a", tarfile.SYMTYPE, "b/.."), member("b", tarfile.SYMTYPE, ".")],
        # A file written through a link: the link would come after a real folder of its name.
        [member("lib", tarfile.SYMTYPE, "/var"), member("lib/x")],
        [member("lib", tarfile.SYMTYPE, "real"), member("lib/x")],
        [member("copy", tarfile.LNKTYPE, "missing")],
        [member("copy", tarfile.LNKTYPE, "../../etc/passwd")],
    ],
    ids=["link-chain-out", "absolute-link-dir", "write-through-link", "hard-link-none", "hard-up"],
)
def test_links_that_lead_out_or_are_written_through_are_refused(tmp_path, members):
    with pytest.raises(UnsafeArchive):
        unpack(tmp_path, [(info, b"x") for info in members])
