"""The register reply's ``workdir`` through the agent API's real URL: the archive as a presigned
GET of the stored object (downloaded here from the local store over HTTP) with its stored size
and sha256 and the key to decrypt it, or the git commit with the deploy key's value."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest

from agent.ckptcrypto import decrypt_stream
from tests.support.factories import JobFactory, TeamSecretFactory, make_attempt
from tests.support.workdir import TRAIN_PY, ready_pack, sha256, tar_gz

pytestmark = pytest.mark.django_db

PACK = tar_gz({"train.py": TRAIN_PY})
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def local_storage(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url


def register(client, job) -> httpx.Response:
    _, token = make_attempt(job)
    return client.post(
        "/api/agent/register",
        data=json.dumps({"agent_version": "1"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def archive_job(team, **fields):
    return JobFactory(team=team, workdir={"kind": "archive", "sha256": sha256(PACK)}, **fields)


def test_a_plain_archive_is_a_presigned_get_of_the_stored_pack(client, cast):
    ready_pack(cast.team_a, PACK)

    reply = register(client, archive_job(cast.team_a)).json()["workdir"]

    assert reply["kind"] == "archive"
    assert reply["encrypted"] is False
    assert reply["data_key_b64"] is None
    assert reply["object"]["size"] == len(PACK)
    assert reply["object"]["sha256"] == sha256(PACK)
    assert httpx.get(reply["object"]["url"]).content == PACK


def test_an_encrypted_archive_comes_with_its_key_and_the_stored_bytes_digest(client, cast):
    ready_pack(cast.team_a, PACK, encrypted=True)

    reply = register(client, archive_job(cast.team_a, encrypt_checkpoints=True)).json()["workdir"]

    stored = httpx.get(reply["object"]["url"]).content
    assert reply["encrypted"] is True
    assert (reply["object"]["size"], reply["object"]["sha256"]) == (len(stored), sha256(stored))
    plain = io.BytesIO()
    decrypt_stream(io.BytesIO(stored), plain, base64.b64decode(reply["data_key_b64"]))
    assert plain.getvalue() == PACK


def test_another_teams_agent_never_gets_this_teams_pack(client, cast):
    ready_pack(cast.team_a, PACK)

    job = archive_job(cast.team_b)
    response = register(client, job)

    assert response.status_code == 410  # the agent stops: no host could run this job
    assert "no longer stored for its team" in response.json()["detail"]
    assert "storage/" not in response.content.decode()  # no URL of any pack
    job.refresh_from_db()
    assert job.state == "failed"
    assert "submit the job again with its code" in job.failure_reason


def test_a_pack_gone_from_storage_fails_the_job_instead_of_losing_host_after_host(
    client, cast, settings
):
    from jobs.models import Interruption, WorkdirPack
    from nomadgpu.storage import object_store

    ready_pack(cast.team_a, PACK)
    pack = WorkdirPack.objects.get(team=cast.team_a)
    object_store(cast.team_a).delete_keys([pack.key])  # a bucket rule, a person, a lost volume
    job = archive_job(cast.team_a)

    response = register(client, job)

    assert response.status_code == 410
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.failure_reason.startswith(f"the job's code pack {pack.sha256[:12]} is gone")
    assert not job.attempts.filter(state__in=["starting", "running"]).exists()  # released
    assert not Interruption.objects.filter(job=job).exists()  # not a host loss


def test_a_git_workdir_is_its_commit_with_the_deploy_keys_value(client, cast):
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"
    TeamSecretFactory(team=cast.team_a, name="DEPLOY_KEY", value=key)
    workdir = {
        "kind": "git",
        "url": "git@github.com:team/private.git",
        "ref": "main",
        "commit": COMMIT,
        "deploy_key_secret": "DEPLOY_KEY",
    }

    reply = register(client, JobFactory(team=cast.team_a, workdir=workdir)).json()["workdir"]

    assert reply == {
        "kind": "git",
        "url": "git@github.com:team/private.git",
        "commit": COMMIT,
        "ssh_key": key,
    }


def test_a_public_git_workdir_has_no_key(client, cast):
    workdir = {"kind": "git", "url": "https://x.test/r.git", "ref": "HEAD", "commit": COMMIT}

    reply = register(client, JobFactory(team=cast.team_a, workdir=workdir)).json()["workdir"]

    assert reply["ssh_key"] is None


def test_a_job_without_code_has_a_null_workdir(client, cast):
    assert register(client, JobFactory(team=cast.team_a)).json()["workdir"] is None
