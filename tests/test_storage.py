"""Both object stores keep one contract: presigned PUT/GET per object, server-driven multipart,
HEAD, listing and deletion. S3 runs against moto's server; local against the live web process."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from nomadgpu.storage import LocalObjectStore, S3ObjectStore, StorageError

KEY = "teams/t1/jobs/7/attempts/1/checkpoints/100/checkpoint.tar"
FIVE_MIB = 5 * 1024 * 1024


@pytest.fixture(params=["s3", "local"])
def store(request, settings, tmp_path):
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return S3ObjectStore(**bucket)
    live_server = request.getfixturevalue("live_server")
    request.getfixturevalue("transactional_db")  # the view asks whether the write may land
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url
    return LocalObjectStore(settings.STORAGE_LOCAL_DIR, live_server.url)


def test_presigned_put_then_get_round_trips_the_bytes(store):
    body = b"weights" * 1000

    put = httpx.put(store.presign_put(KEY), content=body)
    got = httpx.get(store.presign_get(KEY))

    assert put.status_code == 200
    assert got.content == body
    assert store.head(KEY).size == len(body)


def test_multipart_upload_through_presigned_part_urls(store):
    parts_data = [b"a" * FIVE_MIB, b"b" * 1024]
    upload_id = store.create_multipart(KEY)

    etags = []
    for number, data in enumerate(parts_data, start=1):
        response = httpx.put(store.presign_part(KEY, upload_id, number), content=data)
        assert response.status_code == 200, response.text
        etags.append((number, response.headers["ETag"]))
    store.complete_multipart(KEY, upload_id, etags)

    stream = store.open_read(KEY)
    assert (
        hashlib.sha256(stream.read()).hexdigest()
        == hashlib.sha256(b"".join(parts_data)).hexdigest()
    )


def test_a_local_get_url_does_not_open_another_object(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path
    local = LocalObjectStore(tmp_path, live_server.url)
    local.put_bytes(KEY, b"mine")
    local.put_bytes(KEY.replace("/7/", "/8/"), b"theirs")
    url = local.presign_get(KEY).replace("/jobs/7/", "/jobs/8/")

    response = httpx.get(url)

    assert response.status_code == 403


def test_an_s3_presigned_url_is_bound_to_one_key_method_and_lifetime(s3_bucket):
    # moto does not verify presigned signatures (notes: storage-and-reliability §2), so what
    # the URL grants is checked on the URL itself: path, signed headers and expiry.
    store = S3ObjectStore(**s3_bucket)

    url = httpx.URL(store.presign_put(KEY, ttl_s=900))

    assert url.path == f"/{s3_bucket['bucket']}/{KEY}"
    assert url.params["X-Amz-Expires"] == "900"
    assert url.params["X-Amz-SignedHeaders"] == "host"
    assert "X-Amz-Signature" in url.params


def test_only_if_absent_refuses_to_overwrite(store):
    store.put_bytes(f"{KEY}.manifest.json", b"{}", only_if_absent=True)

    with pytest.raises(Exception):  # noqa: B017  (boto's ClientError or StorageError)
        store.put_bytes(f"{KEY}.manifest.json", b"{}", only_if_absent=True)


def test_list_and_delete_by_prefix(store):
    for step in (50, 100, 150):
        store.put_bytes(f"teams/t1/jobs/7/attempts/1/checkpoints/{step}/checkpoint.tar", b"x")

    keys = store.list_keys("teams/t1/jobs/7/")
    store.delete_keys(keys[:2])

    assert len(keys) == 3
    assert store.list_keys("teams/t1/jobs/7/") == keys[2:]
    assert store.head(keys[0]) is None


def test_local_urls_expire(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path
    local = LocalObjectStore(tmp_path, live_server.url)
    local.put_bytes(KEY, b"x")
    url = local.presign_get(KEY, ttl_s=-1)

    response = httpx.get(url)

    assert response.status_code == 403
    assert "expired" in response.json()["detail"]


def test_local_keys_cannot_leave_the_storage_folder(tmp_path):
    local = LocalObjectStore(tmp_path / "objects", "http://x")

    with pytest.raises(StorageError):
        local.put_bytes("../escape", b"x")


def test_local_put_url_cannot_be_used_for_get(settings, tmp_path, live_server):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path
    local = LocalObjectStore(tmp_path, live_server.url)
    local.put_bytes(KEY, b"secret weights")

    response = httpx.get(local.presign_put(KEY))

    assert response.status_code == 403
