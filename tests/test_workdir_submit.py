"""A job's workdir at submit, through the member API: an archive must be a ready pack of the
team stored as the job encrypts; a git ref is resolved with ``git ls-remote`` against a real
bare repository (file://) to the commit that is stored; what cannot be used is refused by name."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests.support.factories import TeamSecretFactory, WorkdirPackFactory
from tests.support.workdir import TRAIN_PY, bare_repository, bearer, ready_pack, sha256, tar_gz

pytestmark = pytest.mark.django_db

PACK = tar_gz({"train.py": TRAIN_PY})
SPEC = {
    "team": "team-a",
    "name": "own-code",
    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    "command": "python train.py",
    "total_steps": 10,
}


@pytest.fixture(autouse=True)
def local_storage(settings, tmp_path):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"


@pytest.fixture
def repo(tmp_path):
    return bare_repository(tmp_path)


def submit(client, user, workdir: dict, **spec):
    body = {**SPEC, **spec, "workdir": workdir}
    return client.post("/api/jobs/", body, content_type="application/json", **bearer(user))


def refusal(response) -> tuple[list, str]:
    assert response.status_code == 422, response.content
    error = response.json()["detail"][0]
    return error["loc"], error["msg"]


def archive(data: bytes = PACK) -> dict:
    return {"kind": "archive", "sha256": sha256(data)}


# ---- archives -------------------------------------------------------------------------------


def test_a_ready_pack_of_the_team_is_stored_as_the_jobs_workdir(client, cast):
    ready_pack(cast.team_a, PACK)

    response = submit(client, cast.member, archive())

    assert response.status_code == 201, response.content
    assert Job.objects.get().workdir == {"kind": "archive", "sha256": sha256(PACK)}


def test_an_unknown_pack_is_refused_saying_upload_the_code_first(client, cast):
    loc, msg = refusal(submit(client, cast.member, archive()))

    assert loc[-2:] == ["workdir", "sha256"]
    assert msg == f"team team-a has no code pack {sha256(PACK)[:12]}: upload the code first"
    assert not Job.objects.exists()


def test_a_pack_still_uploading_is_refused(client, cast):
    WorkdirPackFactory(team=cast.team_a, sha256=sha256(PACK), size=len(PACK))

    _, msg = refusal(submit(client, cast.member, archive()))

    assert "has not finished uploading: upload the code first" in msg


def test_another_teams_ready_pack_is_not_this_teams(client, cast):
    ready_pack(cast.team_b, PACK)

    _, msg = refusal(submit(client, cast.member, archive()))

    assert "team team-a has no code pack" in msg


def test_a_plain_pack_is_refused_for_a_job_that_encrypts_its_checkpoints(client, cast):
    ready_pack(cast.team_a, PACK)

    _, msg = refusal(submit(client, cast.member, archive(), encrypt_checkpoints=True))

    assert "stored plain, and this job needs it encrypted (encrypt_checkpoints is on)" in msg


def test_an_encrypted_pack_serves_a_job_that_encrypts(client, cast):
    ready_pack(cast.team_a, PACK, encrypted=True)

    response = submit(client, cast.member, archive(), encrypt_checkpoints=True)

    assert response.status_code == 201, response.content


def test_a_malformed_sha256_is_422_under_the_workdir(client, cast):
    loc, _ = refusal(submit(client, cast.member, {"kind": "archive", "sha256": "xyz"}))

    assert "workdir" in loc


# ---- git ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "commit"),
    [("main", "main"), ("feature", "first"), ("v1", "first"), ("HEAD", "main")],
)
def test_a_git_ref_is_resolved_to_the_commit_that_is_stored(client, cast, repo, ref, commit):
    url, commits = repo

    response = submit(client, cast.member, {"kind": "git", "url": url, "ref": ref})

    assert response.status_code == 201, response.content
    assert Job.objects.get().workdir == {
        "kind": "git",
        "url": url,
        "ref": ref,
        "commit": commits[commit],
        "deploy_key_secret": "",
    }


def test_no_ref_means_head(client, cast, repo):
    url, commits = repo

    submit(client, cast.member, {"kind": "git", "url": url})

    assert Job.objects.get().workdir["commit"] == commits["main"]


def test_a_40_hex_ref_is_taken_as_the_commit(client, cast, repo):
    url, commits = repo

    submit(client, cast.member, {"kind": "git", "url": url, "ref": commits["first"].upper()})

    assert Job.objects.get().workdir["commit"] == commits["first"]


def test_a_ref_that_does_not_exist_is_refused_naming_it(client, cast, repo):
    url, _ = repo

    loc, msg = refusal(submit(client, cast.member, {"kind": "git", "url": url, "ref": "nope"}))

    assert loc[-1] == "ref"
    assert f"{url} has no branch or tag named 'nope'" in msg
    assert not Job.objects.exists()


def test_an_unreachable_repository_is_refused_naming_it(client, cast, tmp_path):
    url = f"file://{tmp_path / 'missing.git'}"

    loc, msg = refusal(submit(client, cast.member, {"kind": "git", "url": url}))

    assert loc[-1] == "url"
    assert msg.startswith(f"cannot read {url}: ")
    assert "does not appear to be a git repository" in msg


def test_a_protocol_that_runs_commands_is_refused(client, cast, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "transport"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)

    loc, msg = refusal(submit(client, cast.member, {"kind": "git", "url": f"ext::{script}"}))

    assert loc[-1] == "url"
    assert "transport 'ext' not allowed" in msg
    assert not marker.exists()


def test_a_missing_deploy_key_secret_is_refused_naming_it(client, cast, repo):
    url, _ = repo
    workdir = {"kind": "git", "url": url, "deploy_key_secret": "DEPLOY_KEY"}

    loc, msg = refusal(submit(client, cast.member, workdir))

    assert loc[-1] == "deploy_key_secret"
    assert msg == (
        "the team has no secret named 'DEPLOY_KEY': add it on the Team page or in the admin"
    )


def test_a_deploy_key_is_used_over_ssh_and_an_unreachable_host_is_refused(client, cast):
    TeamSecretFactory(team=cast.team_a, name="DEPLOY_KEY", value="not really a key")
    url = "ssh://git@127.0.0.1:1/team/repo.git"  # nothing listens on port 1
    workdir = {"kind": "git", "url": url, "deploy_key_secret": "DEPLOY_KEY"}

    loc, msg = refusal(submit(client, cast.member, workdir))

    assert loc[-1] == "url"
    assert msg.startswith(f"cannot read {url}: ")
