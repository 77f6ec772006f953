"""Writes that come too late: a fenced agent's presigned URLs stay valid for an hour, and a host
frozen mid-PUT finishes its PUT when it thaws. The local store refuses such writes (410, before
and after the body); on S3, what lands is deleted when the attempt closes and by the sweep."""

from __future__ import annotations

from datetime import timedelta

import boto3
import httpx
import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.checkpoints import records
from jobs.models import Attempt, Checkpoint
from nomadgpu.storage import LocalObjectStore, S3ObjectStore
from tests.support.factories import CheckpointFactory, JobFactory, TeamFactory, make_attempt
from tests.support.processes import wait_until

KIB = 1024


def live_attempt(**job_fields) -> Attempt:
    attempt, _ = make_attempt(JobFactory(**job_fields), state="running")
    return attempt


def uploading(attempt: Attempt, step: int, *, size: int = 4 * KIB) -> Checkpoint:
    """What ``plan_upload`` leaves behind: an uploading row at the attempt's key."""
    return CheckpointFactory(
        attempt=attempt,
        step=step,
        key=records.checkpoint_key(attempt, step, encrypted=False),
        size=size,
    )


def close(attempt: Attempt):
    return lifecycle.close_attempt(attempt.pk, reason="heartbeat_timeout", now=timezone.now())


# ---- the local store: the web process refuses the write --------------------------------------


@pytest.fixture
def local(settings, tmp_path, live_server) -> LocalObjectStore:
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url
    return LocalObjectStore(settings.STORAGE_LOCAL_DIR, live_server.url)


@pytest.mark.django_db(transaction=True)
def test_a_live_attempts_upload_lands(local):
    checkpoint = uploading(live_attempt(), 50)

    response = httpx.put(local.presign_put(checkpoint.key), content=b"w" * KIB)

    assert response.status_code == 200
    assert local.head(checkpoint.key).size == KIB


@pytest.mark.django_db(transaction=True)
def test_an_ended_attempts_url_is_refused_and_nothing_lands(local):
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50)
    url = local.presign_put(checkpoint.key)  # handed out while the attempt was live
    close(attempt)

    response = httpx.put(url, content=b"w" * KIB)

    assert response.status_code == 410
    assert "has ended" in response.json()["detail"]
    assert local.head(checkpoint.key) is None


@pytest.mark.django_db(transaction=True)
def test_a_put_begun_while_live_and_ended_after_the_close_does_not_land(local):
    # The frozen host: the PUT started before the attempt was closed, its body arrives after.
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50)

    partial = local.path_for(checkpoint.key).with_name("checkpoint.tar.partial")

    def body():
        yield b"w" * KIB
        # The server has taken the request (past its first check) once it writes aside.
        wait_until(partial.exists, timeout=10, what="the server to start writing the body")
        close(attempt)  # the supervisor gives up on the host mid-body
        yield b"w" * KIB

    # With its length given, the server reads the whole body, as it does from the agent.
    headers = {"Content-Length": str(2 * KIB)}
    response = httpx.put(local.presign_put(checkpoint.key), content=body(), headers=headers)

    assert response.status_code == 410
    assert local.head(checkpoint.key) is None
    assert not list(local.path_for(checkpoint.key).parent.glob("*"))  # no .partial left


@pytest.mark.django_db(transaction=True)
def test_a_part_of_an_ended_attempts_multipart_upload_is_refused(local):
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50, size=100 * 1024 * 1024)
    upload_id = local.create_multipart(checkpoint.key)
    url = local.presign_part(checkpoint.key, upload_id, 1)
    close(attempt)

    assert httpx.put(url, content=b"p" * KIB).status_code == 410


@pytest.mark.django_db(transaction=True)
def test_a_ready_checkpoints_object_cannot_be_written_over(local):
    checkpoint = uploading(live_attempt(), 50)
    url = local.presign_put(checkpoint.key)
    assert httpx.put(url, content=b"good" * KIB).status_code == 200
    Checkpoint.objects.filter(pk=checkpoint.pk).update(state="ready", ready_at=timezone.now())

    response = httpx.put(url, content=b"evil" * KIB)  # the URL is still within its hour

    assert response.status_code == 410
    assert local.open_read(checkpoint.key).read(4) == b"good"


@pytest.mark.django_db(transaction=True)
def test_a_key_that_is_no_checkpoints_is_left_to_the_signature(local):
    key = "teams/t/jobs/1/attempts/1/scratch.bin"

    assert httpx.put(local.presign_put(key), content=b"x").status_code == 200


# ---- S3: the service takes any validly signed PUT, so what lands late is deleted ------------


@pytest.fixture
def s3(settings, s3_bucket) -> S3ObjectStore:
    settings.STORAGE_BACKEND = "s3"
    settings.S3_BUCKET = s3_bucket["bucket"]
    settings.S3_ENDPOINT_URL = s3_bucket["endpoint_url"]
    settings.S3_ACCESS_KEY_ID = "testing"
    settings.S3_SECRET_ACCESS_KEY = "testing"
    settings.S3_REGION = "us-east-1"
    return S3ObjectStore(**s3_bucket)


def multipart_uploads(store: S3ObjectStore) -> list:
    client = boto3.client(
        "s3",
        endpoint_url=store.client.meta.endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    return client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


@pytest.mark.django_db
def test_closing_an_attempt_gives_up_its_uploads_and_deletes_what_landed(
    s3, django_capture_on_commit_callbacks
):
    attempt = live_attempt()
    ready = uploading(attempt, 25)
    s3.put_bytes(ready.key, b"r" * KIB)
    Checkpoint.objects.filter(pk=ready.pk).update(state="ready", ready_at=timezone.now())
    landed = uploading(attempt, 50)  # its PUT finished, its complete never came
    assert httpx.put(s3.presign_put(landed.key), content=b"w" * KIB).status_code == 200
    parted = uploading(attempt, 75, size=100 * 1024 * 1024)
    parted.upload_id = s3.create_multipart(parted.key)
    parted.save(update_fields=["upload_id"])
    part_url = s3.presign_part(parted.key, parted.upload_id, 1)
    assert httpx.put(part_url, content=b"p" * KIB).status_code == 200

    with django_capture_on_commit_callbacks() as callbacks:
        close(attempt)
    sent = [cb.args for cb in callbacks if getattr(cb, "args", None)]
    assert (lifecycle.DISCARD_UPLOADS_TASK, attempt.pk) in sent

    deleted = records.discard_unfinished(attempt.pk)

    manifests = [records.manifest_key(c) for c in (landed, parted)]
    assert sorted(deleted) == sorted([landed.key, parted.key, *manifests])
    assert s3.head(landed.key) is None
    assert multipart_uploads(s3) == []
    assert s3.head(ready.key).size == KIB  # the job resumes from this one
    states = dict(Checkpoint.objects.filter(attempt=attempt).values_list("step", "state"))
    assert states == {25: "ready", 50: "failed", 75: "failed"}


@pytest.mark.django_db
def test_the_sweep_deletes_a_put_that_landed_after_the_close(s3):
    attempt = live_attempt()
    late = uploading(attempt, 50)
    url = s3.presign_put(late.key)
    close(attempt)
    records.discard_unfinished(attempt.pk)
    # The thawed host's PUT: S3 checks only the signature, which is valid for an hour.
    assert httpx.put(url, content=b"w" * KIB).status_code == 200
    assert s3.head(late.key) is not None

    assert records.sweep_late_uploads(now=timezone.now()) == 1

    assert s3.head(late.key) is None


@pytest.mark.django_db
def test_the_sweep_leaves_attempts_whose_urls_have_long_expired(s3):
    attempt = live_attempt()
    uploading(attempt, 50)
    close(attempt)
    long_ago = timezone.now() - records.late_write_window() - timedelta(minutes=1)
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=long_ago)

    assert records.sweep_late_uploads(now=timezone.now()) == 0


@pytest.mark.django_db
def test_a_live_attempts_uploads_are_never_discarded(s3):
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50)
    s3.put_bytes(checkpoint.key, b"w" * KIB)

    assert records.discard_unfinished(attempt.pk) == []
    assert records.sweep_late_uploads(now=timezone.now()) == 0
    assert s3.head(checkpoint.key) is not None


@pytest.mark.django_db
def test_a_complete_that_loses_the_race_with_the_close_is_refused_and_leaves_no_manifest(s3):
    # The agent's complete passed its token check just before the close; the discard then
    # gave the upload up while the complete was verifying the object.
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50, size=KIB)
    s3.put_bytes(checkpoint.key, b"w" * KIB)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(state="failed")  # the discard's first step

    with pytest.raises(records.CheckpointRefused, match="ended before it completed"):
        records.complete_upload(checkpoint, size=KIB, sha256="0" * 64, parts=[], now=timezone.now())

    assert s3.head(records.manifest_key(checkpoint)) is None
    checkpoint.refresh_from_db()
    assert checkpoint.state == "failed"


@pytest.mark.django_db
def test_a_ready_checkpoint_of_a_closed_attempt_keeps_its_object_and_manifest(s3):
    attempt = live_attempt()
    checkpoint = uploading(attempt, 50, size=KIB)
    s3.put_bytes(checkpoint.key, b"w" * KIB)
    records.complete_upload(checkpoint, size=KIB, sha256="a" * 64, parts=[], now=timezone.now())
    close(attempt)

    assert records.discard_unfinished(attempt.pk) == []
    assert s3.head(checkpoint.key) is not None
    assert s3.head(records.manifest_key(checkpoint)) is not None


@pytest.mark.django_db
def test_the_sweep_goes_over_each_attempt_once_and_past_a_broken_bucket(s3):
    broken_team = TeamFactory(
        storage_bucket="no-such-bucket",
        storage_endpoint_url=s3.client.meta.endpoint_url,
        storage_access_key_id="testing",
        storage_secret_access_key="testing",
    )
    broken = live_attempt(team=broken_team)
    uploading(broken, 25)
    sound = live_attempt()
    for step in (25, 50):  # two unfinished uploads, one attempt
        s3.put_bytes(uploading(sound, step).key, b"w" * KIB)
    close(broken)
    close(sound)

    assert records.sweep_late_uploads(now=timezone.now()) == 2

    assert s3.list_keys(sound.storage_prefix) == []
