"""The new-job form's code: an uploaded .tar.gz kept as it is, a .zip repacked into the same
deterministic .tar.gz every time, both stored as the team's pack (encrypted when the job
encrypts); a git URL plus a ref resolved at submit; every refusal under its field."""

from __future__ import annotations

import base64
import io
import tarfile
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from agent.ckptcrypto import decrypt_stream
from jobs.job_templates import template_spec
from jobs.models import Job, WorkdirPack
from nomadgpu.storage import object_store
from portal.forms import spec_to_initial
from tests.support.workdir import TRAIN_PY, bare_repository, sha256, tar_gz

pytestmark = pytest.mark.django_db

PACK = tar_gz({"train.py": TRAIN_PY, "lib/util.py": b"X = 1\n"})


@pytest.fixture(autouse=True)
def local_storage(settings, tmp_path):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


def toy_form(**overrides) -> dict:
    return {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"} | (
        overrides
    )


def upload(name: str, data: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/octet-stream")


def a_zip(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return raw.getvalue()


def stored(pack: WorkdirPack) -> bytes:
    with object_store(pack.team).open_read(pack.key) as stream:
        return stream.read()


def field_errors(response, field: str) -> str:
    form = response.context["form"]
    return " ".join(form.errors.get(field, []))


def test_a_tar_gz_is_stored_as_the_teams_pack_and_becomes_the_jobs_workdir(member_client, cast):
    response = member_client.post(
        reverse("job-new"), toy_form(workdir_archive=upload("code.tar.gz", PACK))
    )

    assert response.status_code == 302, field_errors(response, "workdir_archive")
    job = Job.objects.get()
    assert job.workdir == {"kind": "archive", "sha256": sha256(PACK)}
    pack = WorkdirPack.objects.get()
    assert (pack.team, pack.state, pack.encrypted) == (cast.team_a, "ready", False)
    assert stored(pack) == PACK


def test_a_zip_is_repacked_into_the_same_deterministic_tar_gz_each_time(member_client):
    files = {"train.py": TRAIN_PY, "scripts/run.sh": b"echo hi\n"}
    for _ in range(2):
        member_client.post(
            reverse("job-new"), toy_form(workdir_archive=upload("code.zip", a_zip(files)))
        )

    pack = WorkdirPack.objects.get()
    assert Job.objects.count() == 2
    assert {job.workdir["sha256"] for job in Job.objects.all()} == {pack.sha256}
    with tarfile.open(fileobj=io.BytesIO(stored(pack)), mode="r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["scripts/run.sh", "train.py"]
        assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(0, 0, 0, "")}
        assert tar.extractfile("train.py").read() == TRAIN_PY
    assert stored(pack)[4:8] == b"\0\0\0\0"  # the gzip header's mtime


def test_a_job_that_encrypts_stores_its_pack_encrypted(member_client):
    member_client.post(
        reverse("job-new"),
        toy_form(workdir_archive=upload("code.tgz", PACK), encrypt_checkpoints="on"),
    )

    pack = WorkdirPack.objects.get()
    plain = io.BytesIO()
    decrypt_stream(io.BytesIO(stored(pack)), plain, base64.b64decode(pack.data_key))
    assert pack.encrypted
    assert plain.getvalue() == PACK


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("code.tar.gz", PACK[: len(PACK) // 2], "not a readable .tar.gz"),
        ("code.tar.gz", b"plain text, not gzip", "not a readable .tar.gz"),
        ("code.zip", b"PK\x03\x04 broken", "not a readable .zip"),
        ("code.tar.gz", tar_gz({"../evil.py": b"x"}), "unsafe member"),
        ("code.zip", a_zip({"/etc/evil": b"x"}), "unsafe member"),
        ("code.rar", PACK, "upload a .tar.gz, .tgz or .zip"),
    ],
    ids=["truncated", "not-gzip", "bad-zip", "dotdot", "absolute", "rar"],
)
def test_an_archive_that_cannot_be_a_pack_is_refused_under_its_field(
    member_client, name, data, said
):
    response = member_client.post(reverse("job-new"), toy_form(workdir_archive=upload(name, data)))

    assert response.status_code == 200
    assert said in field_errors(response, "workdir_archive")
    assert 'id="id_workdir_archive_error"' in response.content.decode()
    assert not Job.objects.exists()
    assert not WorkdirPack.objects.exists()


def test_an_archive_over_the_cap_is_refused_with_the_sentence(member_client, settings):
    settings.WORKDIR_MAX_MB = 0

    response = member_client.post(
        reverse("job-new"), toy_form(workdir_archive=upload("code.tar.gz", PACK))
    )

    assert "(WORKDIR_MAX_MB)" in field_errors(response, "workdir_archive")


def test_a_git_url_and_ref_are_resolved_to_a_commit_at_submit(member_client, tmp_path):
    url, commits = bare_repository(tmp_path)

    response = member_client.post(reverse("job-new"), toy_form(git_url=url, git_ref="feature"))

    assert response.status_code == 302
    assert Job.objects.get().workdir["commit"] == commits["first"]


def test_a_git_ref_that_does_not_exist_is_refused_under_the_ref(member_client, tmp_path):
    url, _ = bare_repository(tmp_path)

    response = member_client.post(reverse("job-new"), toy_form(git_url=url, git_ref="nope"))

    assert "no branch or tag named 'nope'" in field_errors(response, "git_ref")
    assert not Job.objects.exists()


def test_an_archive_and_a_repository_together_are_refused(member_client):
    form = toy_form(workdir_archive=upload("code.tar.gz", PACK), git_url="https://x.test/r.git")

    response = member_client.post(reverse("job-new"), form)

    assert "not both" in field_errors(response, "git_url")


def test_the_form_posts_files_with_and_without_javascript(member_client):
    html = member_client.get(reverse("job-new")).content.decode()

    assert 'enctype="multipart/form-data"' in html
    assert 'hx-encoding="multipart/form-data"' in html
    assert 'type="file" name="workdir_archive"' in html
