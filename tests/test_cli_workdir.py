"""``nomadgpu submit`` with a ``workdir``: the folder packed, uploaded once, named by its sha256.

The CLI runs in-process against ``tests.support.member_api_standin`` (real HTTP on loopback), which
answers as issue 28's contract says the member API will; the unreadable-file case runs the CLI
as a subprocess that cannot read what root could.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nomadgpu_cli import cli, pack
from tests.support.member_api_standin import MB, StandIn, serve
from tests.support.processes import ROOT

TOKEN = "ngpt_standin_token"
JOB = """
name = "own-sft"
image = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
command = "python train.py"
workdir = "."
setup = "pip install -r requirements.txt"
secrets = ["HF_TOKEN"]
"""


@pytest.fixture
def standin():
    server_side = StandIn(token=TOKEN)
    server = serve(server_side)
    yield server_side
    server.shutdown()
    server.server_close()


@pytest.fixture
def run(standin, capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["--url", standin.url, "--token", TOKEN, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def project(tmp_path) -> Path:
    """A small fine-tune folder with its job file, as a team would have it."""
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "job.toml").write_text(JOB)
    (root / "train.py").write_text("print('training')\n")
    (root / "requirements.txt").write_text("peft\n")
    (root / "data" / "tiny.jsonl").write_text('{"text": "hi"}\n')
    return root


def members(packed: pack.Pack) -> list[tarfile.TarInfo]:
    packed.file.seek(0)
    with tarfile.open(fileobj=packed.file, mode="r:gz") as tar:
        return tar.getmembers()


def names(folder: Path) -> list[str]:
    with pack.pack_folder(folder, max_bytes=MB) as packed:
        return [m.name for m in members(packed)]


def sha_of(folder: Path) -> str:
    with pack.pack_folder(folder, max_bytes=MB) as packed:
        return packed.sha256


# ---- the pack ---------------------------------------------------------------------------------


def test_the_pack_is_the_same_bytes_whatever_the_files_times(project, tmp_path):
    first = sha_of(project)
    for path in project.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    copy = shutil.copytree(project, tmp_path / "copy", copy_function=shutil.copy)

    assert sha_of(project) == first
    assert sha_of(copy) == first


def test_the_pack_is_sorted_and_owned_by_nobody_at_time_zero(project):
    (project / "train.py").chmod(0o700)

    with pack.pack_folder(project, max_bytes=MB) as packed:
        entries = members(packed)

    assert [m.name for m in entries] == sorted(m.name for m in entries)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in entries} == {(0, 0, 0, "", "")}
    assert {m.name: m.mode for m in entries}["train.py"] == 0o700


def test_the_pack_honours_nested_gitignores_and_the_nomadignore_and_leaves_out_git(project):
    files = {
        ".gitignore": "*.log\n/build/\n",
        "run.log": "x",
        "build/out.bin": "x",
        "sub/.gitignore": "secret.txt\n!keep.log\n",
        "sub/keep.log": "x",
        "sub/secret.txt": "x",
        "sub/build/kept.txt": "x",  # /build/ is anchored to the root's folder
        "secret.txt": "x",  # sub/.gitignore speaks only for sub/
        ".nomadignore": "checkpoints/\n!run.log\n",  # read last: it can take a file back
        "checkpoints/step-10.pt": "x",
        ".git/HEAD": "ref: refs/heads/main\n",
        "sub/.git": "gitdir: ../.git/modules/sub\n",
    }
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)

    assert names(project) == [
        ".gitignore", ".nomadignore", "data", "data/tiny.jsonl", "job.toml", "requirements.txt",
        "run.log", "secret.txt", "sub", "sub/.gitignore", "sub/build", "sub/build/kept.txt",
        "sub/keep.log", "train.py",
    ]  # fmt: skip


def test_links_inside_the_folder_are_kept_and_made_relative(project):
    (project / "latest").symlink_to("data/tiny.jsonl")
    (project / "data" / "absolute").symlink_to(project / "train.py")

    with pack.pack_folder(project, max_bytes=MB) as packed:
        links = {m.name: m.linkname for m in members(packed) if m.issym()}

    assert links == {"latest": "data/tiny.jsonl", "data/absolute": "../train.py"}


# ---- submit: the plain path -------------------------------------------------------------------


def test_submit_uploads_the_pack_to_storage_without_the_token_and_submits_its_sha(
    run, standin, project
):
    code, out, err = run("submit", str(project / "job.toml"))

    assert code == 0, err
    (job,) = standin.jobs
    sha = job["workdir"]["sha256"]
    assert job["workdir"] == {"kind": "archive", "sha256": sha}
    (put,) = standin.requests_to("/storage/")
    assert "authorization" not in put.headers
    assert put.headers["content-length"] == str(len(put.body))
    assert hashlib.sha256(put.body).hexdigest() == sha
    assert [s.path for s in standin.requests_to("/api/workdirs")] == [
        "/api/workdirs",
        f"/api/workdirs/{sha}/complete",
    ]
    assert f"packed {project}: 4 files, " in out
    assert "code uploaded" in out
    assert out.splitlines()[-1].startswith("submitted job 1 (own-sft) to team-a:")


def test_the_folder_is_relative_to_the_job_file_not_to_where_the_cli_runs(
    run, standin, project, monkeypatch
):
    (project / "code").mkdir()
    (project / "code" / "train.py").write_text("print(1)\n")
    (project / "job.toml").write_text(JOB.replace('workdir = "."', 'workdir = "code"'))
    monkeypatch.chdir(ROOT)

    assert run("submit", str(project / "job.toml"))[0] == 0

    (put,) = standin.requests_to("/storage/")
    with tarfile.open(fileobj=io.BytesIO(put.body), mode="r:gz") as tar:
        assert tar.getnames() == ["train.py"]


def test_resubmitting_unchanged_code_uploads_nothing(run, standin, project):
    run("submit", str(project / "job.toml"))
    (project / "train.py").touch()

    code, out, _ = run("submit", str(project / "job.toml"))

    assert code == 0
    assert "code unchanged: nothing to upload" in out
    assert len(standin.requests_to("/storage/")) == 1
    assert len(standin.requests_to("/api/workdirs/")) == 1  # the first submit's complete
    assert standin.jobs[0]["workdir"] == standin.jobs[1]["workdir"]


def test_a_stored_pack_the_server_finds_different_is_uploaded_again(run, standin, project):
    standin.corrupt_next_storage_put = True

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == 0
    assert "does not match its sha256 and size; uploading again" in err
    assert len(standin.requests_to("/storage/")) == 2
    assert len(standin.jobs) == 1


# ---- submit: the encrypted path ---------------------------------------------------------------


def test_an_encrypted_job_puts_its_pack_to_the_api_with_the_token(run, standin, project):
    (project / "job.toml").write_text(JOB + "encrypt_checkpoints = true\n")

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == 0, err
    sha = standin.jobs[0]["workdir"]["sha256"]
    (put,) = standin.requests_to(f"/api/workdirs/{sha}/content")
    assert put.method == "PUT"
    assert put.headers["authorization"] == f"Bearer {TOKEN}"
    assert hashlib.sha256(put.body).hexdigest() == sha
    assert standin.requests_to("/storage/") == []
    assert standin.requests_to(f"/api/workdirs/{sha}/complete") == []
    offer = json.loads(standin.requests_to("/api/workdirs", "POST")[0].body)
    assert offer == {"team": None, "sha256": sha, "size": len(put.body), "encrypted": True}


def test_the_token_is_never_sent_to_another_host_the_server_names(run, standin, project):
    original = standin.offer

    def elsewhere(body):
        reply = original(body)
        reply.body["upload"]["url"] = "http://127.0.0.2:9/api/workdirs/x/content"
        return reply

    standin.offer = elsewhere
    (project / "job.toml").write_text(JOB + "encrypt_checkpoints = true\n")

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == cli.EXIT_REFUSED
    assert "not to itself: refused" in err
    assert standin.jobs == []


# ---- what passes through ----------------------------------------------------------------------


def test_a_git_workdir_setup_and_secrets_pass_through(run, standin, tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        JOB.replace('workdir = "."\n', "")
        + 'image_login_secret = "GHCR"\n'
        + '[workdir]\ngit = "git@github.com:team/ft.git"\nref = "main"\n'
        + 'deploy_key_secret = "DEPLOY_KEY"\n'
    )

    code, _, err = run("submit", str(job_file))

    assert code == 0, err
    (job,) = standin.jobs
    assert job["workdir"] == {
        "kind": "git", "url": "git@github.com:team/ft.git", "ref": "main",
        "deploy_key_secret": "DEPLOY_KEY",
    }  # fmt: skip
    assert (job["setup"], job["secrets"], job["image_login_secret"]) == (
        "pip install -r requirements.txt",
        ["HF_TOKEN"],
        "GHCR",
    )
    assert standin.requests_to("/api/workdirs") == []


# ---- refusals: nothing is submitted -----------------------------------------------------------


def random_files(folder: Path, sizes_kb: dict[str, int]) -> None:
    for name, kb in sizes_kb.items():
        (folder / name).write_bytes(os.urandom(kb * 1024))  # incompressible


def test_over_the_cap_the_cli_names_the_five_biggest_files(run, standin, project, monkeypatch):
    random_files(
        project / "data",
        {"a.bin": 300, "b.bin": 250, "c.bin": 200, "d.bin": 150, "e.bin": 120, "small.bin": 100},
    )
    monkeypatch.setenv("NOMADGPU_WORKDIR_MAX_MB", "0.5")

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == cli.EXIT_REFUSED
    assert "the code pack is over 0.5 MB" in err
    listed = [line.split()[-1] for line in err.splitlines() if line.startswith("  ")]
    assert listed == [f"data/{c}.bin" for c in "abcde"]
    assert "   300.0 KB  data/a.bin" in err
    assert ".nomadignore" in err
    assert standin.seen == []


def test_the_servers_413_is_shown_with_the_biggest_files(run, standin, project):
    random_files(project / "data", {"weights.bin": 200})
    standin.max_bytes = MB // 8

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == cli.EXIT_REFUSED
    assert "413: the code pack is 0.2 MB; the limit is 0.125 MB (WORKDIR_MAX_MB)" in err
    assert "   200.0 KB  data/weights.bin" in err
    assert standin.jobs == []


@pytest.mark.parametrize(
    "target",
    ["../outside.txt", "../proj/train.py", "ABSOLUTE"],
    ids=["up", "out-and-back-in", "absolute"],  # the second would leave where the pack lands
)
def test_a_link_leaving_the_folder_is_refused(run, standin, project, target):
    outside = project.parent / "outside.txt"
    outside.write_text("not the job's")
    (project / "link").symlink_to(str(outside) if target == "ABSOLUTE" else target)

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == cli.EXIT_REFUSED
    assert "link is a symbolic link to" in err
    assert "outside the workdir: the host would not have it" in err
    assert standin.seen == []


def test_a_link_that_is_left_out_may_point_anywhere(project, tmp_path):
    (tmp_path / "venv").mkdir()
    (project / ".venv").symlink_to(tmp_path / "venv")
    (project / ".gitignore").write_text(".venv\n")

    assert ".venv" not in names(project)


def test_a_missing_folder_is_refused(run, standin, project):
    (project / "job.toml").write_text(JOB.replace('workdir = "."', 'workdir = "nope"'))

    code, _, err = run("submit", str(project / "job.toml"))

    assert code == cli.EXIT_REFUSED
    assert f"the workdir {project / 'nope'} is not a folder" in err
    assert standin.seen == []


def without_root_reads() -> list[str]:
    """A prefix that runs a command unable to read what its permissions forbid: as root, with
    the two capabilities that let root read anything dropped."""
    if os.geteuid() != 0:
        return []
    # setpriv is util-linux's, on every Debian: without it root reads everything, and the
    # refusal this tests could not be seen.
    assert shutil.which("setpriv"), "running as root: install util-linux for setpriv"
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("what", ["file", "folder"])
def test_an_unreadable_file_or_folder_is_refused_with_exit_2(standin, project, what):
    unreadable = project / "train.py" if what == "file" else project / "data"
    unreadable.chmod(0)
    try:
        result = subprocess.run(
            [*without_root_reads(), sys.executable, "-m", "nomadgpu_cli", "--url", standin.url,
             "submit", str(project / "job.toml")],
            cwd=ROOT, env={"NOMADGPU_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        unreadable.chmod(0o755)

    assert result.returncode == cli.EXIT_REFUSED, result.stderr
    assert f"cannot read {'the folder ' if what == 'folder' else ''}{unreadable}" in result.stderr
    assert "Permission denied" in result.stderr
    assert standin.seen == []
