"""Restoring a checkpoint over parallel ranged GETs (agent.checkpoints.restore): against moto's
S3 server and against a small stdlib server that can ignore Range, damage or drop a response,
or hold back the object's tail."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from agent import checkpoints as ck
from agent.checkpoints import ranged
from tests.support.processes import wait_until

KEY = os.urandom(32)
BLOCK = 256 * 1024


@pytest.fixture(autouse=True)
def small_objects_are_ranged_too(monkeypatch):
    monkeypatch.setattr(ranged, "RANGED_MIN_SIZE", 1)  # the tests' objects are a few MB
    monkeypatch.setattr(ranged, "RANGE_RETRY_BASE_S", 0.0)


@pytest.fixture
def storage():
    with httpx.Client(timeout=httpx.Timeout(30.0)) as client:
        yield client


def make_folder(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "optimizer.pt").write_bytes(os.urandom(2 * 1024 * 1024 + 123))
    (path / "sub" / "adapter.safetensors").write_bytes(os.urandom(1024 * 1024 + 7))
    (path / "trainer_state.json").write_text('{"global_step": 300}\n')
    return path


def packed(folder: Path, encrypted: bool) -> bytes:
    plan = ck.plan_tar(folder)
    return b"".join(ck.object_pieces(plan, ck.new_crypt(KEY) if encrypted else None))


def describe(data: bytes, url: str) -> dict:
    return {"url": url, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def same_tree(a: Path, b: Path) -> None:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


# --- a storage server whose faults the test chooses ------------------------------------------


@dataclass
class Storage:
    data: bytes
    ranges: bool = True  # False: answer every GET with the whole object (200)
    status: int = 200  # anything else: every GET is refused with it
    corrupt_at: int | None = None  # flip this byte in every response that carries it
    drop_once_at: int | None = None  # the first response carrying this byte stops just before it
    hold_from: int | None = None  # responses carrying this byte wait for `release`
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[str | None] = field(default_factory=list)  # each GET's Range header


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        spec: Storage = self.server.spec  # type: ignore[attr-defined]
        header = self.headers.get("Range")
        spec.requests.append(header)
        if spec.status != 200:
            self._reply(spec.status, b"refused", {})
            return
        start, end = 0, len(spec.data)
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", header or "")
        ranged = bool(spec.ranges and match)
        if ranged:
            start, end = int(match[1]), min(int(match[2]) + 1, len(spec.data))
        body = bytearray(spec.data[start:end])
        if spec.corrupt_at is not None and start <= spec.corrupt_at < end:
            body[spec.corrupt_at - start] ^= 0xFF
        if spec.hold_from is not None and start <= spec.hold_from < end:
            spec.release.wait(30)
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(spec.data)}"} if ranged else {}
        if spec.drop_once_at is not None and start <= spec.drop_once_at < end:
            cut, spec.drop_once_at = spec.drop_once_at - start, None
            self._reply(206 if ranged else 200, bytes(body), headers, send=cut)
            self.close_connection = True
            return
        self._reply(206 if ranged else 200, bytes(body), headers)

    def _reply(self, status: int, body: bytes, headers: dict, send: int | None = None) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body if send is None else body[:send])

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve():
    servers: list[ThreadingHTTPServer] = []

    def start(spec: Storage) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.spec = spec  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/ckpt?signature=x"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def restore(storage, obj, tmp_path: Path, *, encrypted: bool, connections: int = 4):
    counter = ck.ByteCounter()
    stats = ck.restore(
        storage,
        obj,
        tmp_path / "resume-300",
        scratch=tmp_path / ".resume-300.download",
        data_key=KEY if encrypted else None,
        counter=counter,
        connections=connections,
        block_size=BLOCK,
    )
    return stats, counter


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_parallel_ranges_from_s3_restore_the_same_files(s3_bucket, storage, tmp_path, encrypted):
    import boto3

    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, encrypted)
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_bucket["endpoint_url"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    s3.put_object(Bucket=s3_bucket["bucket"], Key="ckpt", Body=data)
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": s3_bucket["bucket"], "Key": "ckpt"}, ExpiresIn=600
    )

    stats, counter = restore(storage, describe(data, url), tmp_path, encrypted=encrypted)

    same_tree(folder, tmp_path / "resume-300")
    assert stats.connections == 4
    assert counter.down == len(data) == stats.size
    assert not (tmp_path / ".resume-300.download").exists()
    assert not (tmp_path / "resume-300.partial").exists()


def test_every_byte_is_fetched_once_in_blocks_over_several_connections(serve, storage, tmp_path):
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, False)
    spec = Storage(data)

    stats, counter = restore(storage, describe(data, serve(spec)), tmp_path, encrypted=False)

    same_tree(folder, tmp_path / "resume-300")
    expected = [f"bytes={a}-{min(a + BLOCK, len(data)) - 1}" for a in range(0, len(data), BLOCK)]
    assert sorted(spec.requests) == sorted(expected)  # no byte twice, none left out
    assert stats.connections == 4
    assert counter.down == len(data)


def test_storage_without_range_support_is_read_from_its_one_answer(serve, storage, tmp_path):
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, True)
    spec = Storage(data, ranges=False)

    stats, counter = restore(storage, describe(data, serve(spec)), tmp_path, encrypted=True)

    same_tree(folder, tmp_path / "resume-300")
    assert stats.connections == 1
    assert spec.requests == [f"bytes=0-{BLOCK - 1}"]  # the probe's 200 carried everything
    assert counter.down == len(data)


def test_a_small_object_takes_one_plain_get(serve, storage, tmp_path, monkeypatch):
    monkeypatch.setattr(ranged, "RANGED_MIN_SIZE", 8 * 1024 * 1024)
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, False)
    spec = Storage(data)

    stats, counter = restore(storage, describe(data, serve(spec)), tmp_path, encrypted=False)

    same_tree(folder, tmp_path / "resume-300")
    assert (stats.connections, spec.requests, counter.down) == (1, [None], len(data))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("where", [700, 5 * BLOCK + 3, -1], ids=["header", "middle", "last"])
def test_a_damaged_range_is_a_download_error_and_leaves_nothing(
    serve, storage, tmp_path, encrypted, where
):
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, encrypted)
    spec = Storage(data, corrupt_at=where % len(data))

    with pytest.raises(ck.DownloadError, match="sha256"):
        restore(storage, describe(data, serve(spec)), tmp_path, encrypted=encrypted)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-300"]


def test_a_dropped_range_is_fetched_again_from_where_it_stopped(serve, storage, tmp_path):
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, True)
    cut = 3 * BLOCK + 1000
    spec = Storage(data, drop_once_at=cut)

    _, counter = restore(storage, describe(data, serve(spec)), tmp_path, encrypted=True)

    same_tree(folder, tmp_path / "resume-300")
    assert f"bytes={cut}-{4 * BLOCK - 1}" in spec.requests
    assert counter.down == len(data)  # the first 1000 bytes of that range were kept


def test_a_range_that_keeps_failing_is_a_download_error(serve, storage, tmp_path, monkeypatch):
    monkeypatch.setattr(ranged, "RANGE_RETRIES", 1)
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, False)
    spec = Storage(data, drop_once_at=2 * BLOCK + 5)

    with pytest.raises(ck.DownloadError, match="download failed"):
        restore(storage, describe(data, serve(spec)), tmp_path, encrypted=False)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-300"]


def test_a_refused_url_is_a_download_error_without_retries(serve, storage, tmp_path):
    data = os.urandom(3 * BLOCK)
    spec = Storage(data, status=403)

    with pytest.raises(ck.DownloadError, match="403"):
        restore(storage, describe(data, serve(spec)), tmp_path, encrypted=False)

    assert len(spec.requests) == 1


def test_an_object_of_another_size_is_a_download_error(serve, storage, tmp_path):
    data = os.urandom(3 * BLOCK)
    obj = {**describe(data, serve(Storage(data))), "size": len(data) + 1}

    with pytest.raises(ck.DownloadError, match="Content-Range"):
        restore(storage, obj, tmp_path, encrypted=False)


def test_intact_bytes_that_do_not_unpack_are_not_a_download_error(serve, storage, tmp_path):
    data = os.urandom(3 * BLOCK)  # the sha256 matches, but it is no tar (nor ngck1)

    with pytest.raises(ck.RestoreError) as caught:
        restore(storage, describe(data, serve(Storage(data))), tmp_path, encrypted=True)

    assert not isinstance(caught.value, ck.DownloadError)
    assert "decrypt" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_unpacking_starts_before_the_last_bytes_arrive(serve, storage, tmp_path):
    folder = make_folder(tmp_path / "checkpoint-300")
    data = packed(folder, False)
    spec = Storage(data, hold_from=len(data) - 1)
    url = serve(spec)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["stats"] = restore(storage, describe(data, url), tmp_path, encrypted=False)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        first = tmp_path / "resume-300.partial" / "optimizer.pt"  # the tar's first file
        wait_until(
            lambda: first.is_file() and first.stat().st_size == 2 * 1024 * 1024 + 123,
            timeout=20,
            what="the first file to be unpacked while the tail is held back",
        )
        assert not (tmp_path / "resume-300").exists()  # nothing is final before the sha256
    finally:
        spec.release.set()
        thread.join(30)
    assert "error" not in outcome, outcome
    same_tree(folder, tmp_path / "resume-300")
