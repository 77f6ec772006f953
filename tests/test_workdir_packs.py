"""Code packs through the member API's real URLs: a plain pack PUT by presigned URL to the local
store (over HTTP) or S3 (moto's server) and completed; an encrypted one PUT to the API and
stored as ngck1; a pack already stored uploads nothing; mismatches are 409, the cap 413."""

from __future__ import annotations

import base64
import io
import os

import httpx
import pytest

from agent.ckptcrypto import decrypt_stream
from jobs.models import WorkdirPack
from nomadgpu.storage import LocalObjectStore, S3ObjectStore
from tests.support.workdir import TRAIN_PY, bearer, pack_body, ready_pack, sha256, tar_gz

# Transactional: the local store's guard, in the live server's thread, reads the pack rows.
pytestmark = pytest.mark.django_db(transaction=True)

PACK = tar_gz({"train.py": TRAIN_PY, "data/config.json": b"{}"})
TAMPERED = PACK[:20] + bytes([PACK[20] ^ 1]) + PACK[21:]  # the same size, another sha256


def use_local(settings, tmp_path, live_server) -> LocalObjectStore:
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    settings.SITE_URL = live_server.url
    return LocalObjectStore(settings.STORAGE_LOCAL_DIR, live_server.url)


def use_s3(settings, bucket: dict) -> S3ObjectStore:
    settings.STORAGE_BACKEND = "s3"
    settings.S3_BUCKET = bucket["bucket"]
    settings.S3_ENDPOINT_URL = bucket["endpoint_url"]
    settings.S3_ACCESS_KEY_ID = "testing"
    settings.S3_SECRET_ACCESS_KEY = "testing"
    settings.S3_REGION = "us-east-1"
    return S3ObjectStore(**bucket)


@pytest.fixture(params=["local", "s3"])
def store(request, settings, tmp_path):
    """The server's storage, on each backend, and a handle to read it back."""
    if request.param == "s3":
        return use_s3(settings, request.getfixturevalue("s3_bucket"))
    return use_local(settings, tmp_path, request.getfixturevalue("live_server"))


def post(client, url: str, body: dict, user):
    return client.post(url, body, content_type="application/json", **bearer(user))


def put_content(client, url: str, data: bytes, user):
    return client.put(url, data, content_type="application/octet-stream", **bearer(user))


def stored_bytes(store, key: str) -> bytes:
    with store.open_read(key) as stream:
        return stream.read()


def test_a_plain_pack_goes_to_storage_by_presigned_put_and_is_ready_once_completed(
    client, cast, store
):
    asked = post(client, "/api/workdirs", pack_body(PACK), cast.member)
    upload = asked.json()["upload"]
    put = httpx.put(upload["url"], content=PACK)
    done = post(client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.member)

    assert asked.status_code == 200
    assert asked.json()["state"] == "uploading"
    assert upload["method"] == "PUT"
    assert upload["via"] == "storage"
    assert put.status_code == 200
    assert done.status_code == 200, done.content
    assert done.json() == {"sha256": sha256(PACK), "state": "ready"}
    pack = WorkdirPack.objects.get()
    assert (pack.stored_sha256, pack.stored_size) == (sha256(PACK), len(PACK))
    assert stored_bytes(store, pack.key) == PACK
    assert pack.key == f"teams/team-a/workdirs/{sha256(PACK)}.tar.gz"


def test_an_encrypted_pack_is_put_to_the_api_and_stored_only_as_ngck1(client, cast, store):
    asked = post(client, "/api/workdirs", pack_body(PACK, encrypted=True), cast.member)
    upload = asked.json()["upload"]
    put = put_content(client, upload["url"], PACK, cast.member)

    assert upload["via"] == "api"
    assert upload["url"].startswith(f"/api/workdirs/{sha256(PACK)}/content")
    assert put.status_code == 200, put.content
    assert put.json() == {"sha256": sha256(PACK), "state": "ready"}
    pack = WorkdirPack.objects.get()
    stored = stored_bytes(store, pack.key)
    assert pack.key.endswith(".tar.gz.ngck1")
    assert stored.startswith(b"NGCK")
    assert TRAIN_PY not in stored
    assert (pack.stored_sha256, pack.stored_size) == (sha256(stored), len(stored))
    plain = io.BytesIO()
    decrypt_stream(io.BytesIO(stored), plain, base64.b64decode(pack.data_key))
    assert plain.getvalue() == PACK


@pytest.mark.parametrize("encrypted", [False, True])
def test_a_pack_already_stored_is_ready_and_nothing_is_uploaded(client, cast, store, encrypted):
    ready_pack(cast.team_a, PACK, encrypted=encrypted)

    asked = post(client, "/api/workdirs", pack_body(PACK, encrypted=encrypted), cast.member)

    assert asked.status_code == 200
    assert asked.json() == {"sha256": sha256(PACK), "state": "ready"}


def test_a_ready_pack_whose_object_is_gone_is_asked_for_again(client, cast, store):
    pack = ready_pack(cast.team_a, PACK)
    store.delete_keys([pack.key])

    asked = post(client, "/api/workdirs", pack_body(PACK), cast.member)

    assert asked.json()["state"] == "uploading"
    assert asked.json()["upload"]["via"] == "storage"


@pytest.mark.parametrize(
    ("uploaded", "said"),
    [(PACK[:-1], "were announced"), (TAMPERED, "sha256")],
    ids=["size", "sha256"],
)
def test_a_complete_whose_object_differs_is_409_and_the_pack_stays_uploading(
    client, cast, store, uploaded, said
):
    asked = post(client, "/api/workdirs", pack_body(PACK), cast.member)
    httpx.put(asked.json()["upload"]["url"], content=uploaded)

    done = post(client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.member)

    assert done.status_code == 409
    assert said in done.json()["detail"]
    assert WorkdirPack.objects.get().state == "uploading"
    again = post(client, "/api/workdirs", pack_body(PACK), cast.member)
    httpx.put(again.json()["upload"]["url"], content=PACK)
    retried = post(
        client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.member
    )
    assert retried.json()["state"] == "ready"


def test_a_complete_before_any_upload_is_409(client, cast, store):
    post(client, "/api/workdirs", pack_body(PACK), cast.member)

    done = post(client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.member)

    assert done.status_code == 409
    assert "nothing has been uploaded" in done.json()["detail"]


def test_an_encrypted_body_that_is_not_the_pack_is_409_and_nothing_is_stored(client, cast, store):
    asked = post(client, "/api/workdirs", pack_body(PACK, encrypted=True), cast.member)

    put = put_content(client, asked.json()["upload"]["url"], PACK + b"more", cast.member)

    assert put.status_code == 409
    assert "longer than" in put.json()["detail"]
    pack = WorkdirPack.objects.get()
    assert pack.state == "uploading"
    assert store.head(pack.key) is None


def test_a_pack_over_the_cap_is_413_with_the_sentence(client, cast, settings):
    settings.WORKDIR_MAX_MB = 1
    body = {**pack_body(PACK), "size": 1024 * 1024 + 1}

    asked = post(client, "/api/workdirs", body, cast.member)

    assert asked.status_code == 413
    assert asked.json() == {"detail": "the code pack is 1.1 MB; the limit is 1 MB (WORKDIR_MAX_MB)"}
    assert not WorkdirPack.objects.exists()


def test_an_outsider_cannot_upload_to_or_complete_another_teams_pack(client, cast):
    asked = post(client, "/api/workdirs", pack_body(PACK), cast.outsider)
    completed = post(
        client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.outsider
    )

    assert asked.status_code == 404
    assert completed.status_code == 404


def test_a_bad_sha256_is_422_naming_the_field(client, cast):
    asked = post(client, "/api/workdirs", {**pack_body(PACK), "sha256": "abc"}, cast.member)

    assert asked.status_code == 422
    assert asked.json()["detail"][0]["loc"][-1] == "sha256"


# ---- the local store's guard: a pack's object is written only while it uploads --------------


@pytest.fixture
def local(settings, tmp_path, live_server) -> LocalObjectStore:
    # Only the local store can refuse a signed PUT: S3 takes any until the URL expires.
    return use_local(settings, tmp_path, live_server)


def test_a_ready_packs_object_cannot_be_written_over_through_its_old_url(client, cast, local):
    asked = post(client, "/api/workdirs", pack_body(PACK), cast.member)
    url = asked.json()["upload"]["url"]
    httpx.put(url, content=PACK)
    post(client, f"/api/workdirs/{sha256(PACK)}/complete", {"team": "team-a"}, cast.member)

    late = httpx.put(url, content=b"something else")

    assert late.status_code == 410
    assert "ready" in late.json()["detail"]
    assert stored_bytes(local, WorkdirPack.objects.get().key) == PACK


def test_an_encrypted_packs_key_is_never_written_by_a_presigned_put(client, cast, local):
    post(client, "/api/workdirs", pack_body(PACK, encrypted=True), cast.member)
    key = WorkdirPack.objects.get().key

    put = httpx.put(local.presign_put(key), content=PACK)

    assert put.status_code == 410
    assert local.head(key) is None


def test_an_encrypted_pack_far_over_the_json_body_cap_streams_through_the_api(
    client, cast, store, settings
):
    big = os.urandom(5 * 1024 * 1024)  # two ngck1 chunks, far over what a JSON body may be
    assert len(big) > 10 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    asked = post(client, "/api/workdirs", pack_body(big, encrypted=True), cast.member)

    put = put_content(client, asked.json()["upload"]["url"], big, cast.member)

    assert put.status_code == 200, put.content
    plain = io.BytesIO()
    pack = WorkdirPack.objects.get()
    decrypt_stream(
        io.BytesIO(stored_bytes(store, pack.key)), plain, base64.b64decode(pack.data_key)
    )
    assert plain.getvalue() == big
