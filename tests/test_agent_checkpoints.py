"""Packing a checkpoint directory, finding ready ones, and unpacking only what is safe."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from pathlib import Path

import httpx
import pytest

from agent import checkpoints as ck
from agent import mark_ready
from agent.ckptcrypto import decrypt_stream


def make_checkpoint(path: Path, step: int = 5, *, ready: bool = True) -> Path:
    (path / "sub" / "deeper").mkdir(parents=True)
    (path / "weights.bin").write_bytes(os.urandom(3000))
    (path / "sub" / "config.json").write_text('{"lr": 0.001}')
    (path / "sub" / "deeper" / "empty").write_bytes(b"")
    (path / "näme with spaces.txt").write_text("unicode")
    (path / ("a" * 120)).write_text("long name")  # needs a pax header
    if ready:
        mark_ready(path, step)
    return path


def packed(plan: ck.TarPlan, crypt=None) -> bytes:
    return b"".join(ck.object_pieces(plan, crypt))


def test_the_planned_size_is_the_packed_size_and_the_tar_reads_back(tmp_path):
    src = make_checkpoint(tmp_path / "ckpt")
    os.symlink("/etc/passwd", src / "link")
    plan = ck.plan_tar(src)
    data = packed(plan)

    assert len(data) == plan.size
    assert plan.size % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        assert tar.extractfile("sub/config.json").read() == b'{"lr": 0.001}'
    assert "NOMAD_READY" not in names
    assert "link" not in names
    assert {"weights.bin", "sub", "sub/deeper", "sub/deeper/empty", "a" * 120} <= set(names)


def test_packing_twice_with_the_same_key_material_gives_the_same_bytes(tmp_path):
    plan = ck.plan_tar(make_checkpoint(tmp_path / "ckpt"))
    crypt = ck.new_crypt(os.urandom(32))
    first = packed(plan, crypt)
    assert packed(plan, crypt) == first
    assert len(first) == ck.object_size(plan, encrypted=True)
    plain = io.BytesIO()
    decrypt_stream(io.BytesIO(first), plain, crypt["key"])
    assert plain.getvalue() == packed(plan)


def test_a_file_changing_while_packed_aborts_the_checkpoint(tmp_path):
    src = make_checkpoint(tmp_path / "ckpt")
    plan = ck.plan_tar(src)
    (src / "weights.bin").write_bytes(b"shorter")
    with pytest.raises(ck.CheckpointChanged):
        packed(plan)
    (src / "weights.bin").unlink()
    with pytest.raises(ck.CheckpointChanged):
        packed(plan)


def test_find_ready_lists_marked_not_uploaded_directories_by_step(tmp_path):
    make_checkpoint(tmp_path / "b", step=20)
    make_checkpoint(tmp_path / "a", step=30)
    make_checkpoint(tmp_path / "unmarked", ready=False)
    done = make_checkpoint(tmp_path / "done", step=10)
    (done / "NOMAD_UPLOADED").write_text("id")
    make_checkpoint(tmp_path / ".hidden", step=5)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "NOMAD_READY").write_text("soon")
    bad = []

    found = ck.find_ready(tmp_path, on_bad_marker=lambda path, text: bad.append(text))

    assert [(r.path.name, r.step) for r in found] == [("b", 20), ("a", 30)]
    assert bad == ["soon"]


def test_a_checkpoint_this_agent_uploaded_is_found_on_disk_by_its_id(tmp_path):
    # The host rebooted and came back with its disk: the resume needs no download.
    uploaded = make_checkpoint(tmp_path / "checkpoint-20", step=20)
    (uploaded / "NOMAD_UPLOADED").write_text("7\n")
    make_checkpoint(tmp_path / "checkpoint-40", step=40)

    assert ck.local_copy(tmp_path, 7, 20) == uploaded
    assert ck.local_copy(tmp_path, 8, 20) is None  # another checkpoint of that step
    assert ck.local_copy(tmp_path, 7, 40) is None


def test_a_ready_checkpoint_whose_marker_was_never_written_counts_when_it_packs_to_the_digest(
    tmp_path,
):
    # The reboot came between the supervisor's "ready" and the agent's NOMAD_UPLOADED.
    ready = make_checkpoint(tmp_path / "checkpoint-20", step=20)
    digest = hashlib.sha256(packed(ck.plan_tar(ready))).hexdigest()

    assert ck.local_copy(tmp_path, 7, 20, sha256=digest) == ready
    assert ck.local_copy(tmp_path, 7, 20, sha256="0" * 64) is None
    assert ck.local_copy(tmp_path, 7, 20) is None  # encrypted: nothing to compare with


def test_a_finished_restore_is_found_again_but_not_one_cut_short(tmp_path):
    target = tmp_path / "resume-20"
    target.mkdir()
    assert ck.local_copy(tmp_path, 7, 20) is None  # unpacked, maybe partly: no note yet

    ck.mark_restored(target, 7)

    assert ck.local_copy(tmp_path, 7, 20) == target
    assert ck.find_ready(tmp_path, on_bad_marker=lambda *_: None) == []  # the note is no ckpt


def test_unpack_restores_files_and_decrypts(tmp_path):
    src = make_checkpoint(tmp_path / "ckpt")
    plan = ck.plan_tar(src)
    key = os.urandom(32)
    archive = tmp_path / "object"
    archive.write_bytes(packed(plan, ck.new_crypt(key)))

    ck.unpack(archive, tmp_path / "restored", data_key=key)

    restored = tmp_path / "restored"
    assert (restored / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    assert (restored / "sub" / "deeper" / "empty").read_bytes() == b""
    assert not (restored / "NOMAD_READY").exists()


def hostile_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        member.size = len(data) if member.isreg() else 0
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    "bad",
    [
        member("../escaped.txt"),
        member("sub/../../escaped.txt"),
        member("/nomad-test-absolute-escape.txt"),
        member("link", tarfile.SYMTYPE, "/etc/passwd"),
        member("link", tarfile.SYMTYPE, "../../escaped.txt"),
        member("hard", tarfile.LNKTYPE, "../escaped.txt"),
        member("dev", tarfile.CHRTYPE),
        member("fifo", tarfile.FIFOTYPE),
        member("fine.txt"),  # a second copy would overwrite the first
    ],
    ids=lambda m: f"{m.name}:{m.type.decode()}",
)
def test_unpack_refuses_anything_but_files_and_directories_inside_the_target(tmp_path, bad):
    archive = hostile_tar(tmp_path / "evil.tar", bad)
    target = tmp_path / "deep" / "target"
    target.parent.mkdir()

    with pytest.raises(ck.UnsafeArchive):
        ck.unpack(archive, target, data_key=None)

    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not Path("/nomad-test-absolute-escape.txt").exists()
    assert not target.exists()
    assert not target.with_name("target.partial").exists()


def test_unpack_reports_a_damaged_encrypted_checkpoint_as_a_restore_error(tmp_path):
    key = os.urandom(32)
    data = bytearray(packed(ck.plan_tar(make_checkpoint(tmp_path / "ckpt")), ck.new_crypt(key)))
    data[100] ^= 1
    archive = tmp_path / "object"
    archive.write_bytes(bytes(data))

    with pytest.raises(ck.RestoreError, match="decrypt"):
        ck.unpack(archive, tmp_path / "restored", data_key=key)
    assert not (tmp_path / "restored").exists()


class FlakyStorage:
    """An httpx transport standing in for S3: answers from a script, keeps what it got. Parts
    arrive on several threads in any order, so they are kept, and fail, by part number."""

    def __init__(self, *statuses: int, failing_parts: dict[int, int] | None = None) -> None:
        self.statuses = list(statuses)
        self.failing_parts = dict(failing_parts or {})
        self.bodies: list[bytes] = []
        self.parts: dict[int, list[bytes]] = {}
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        part = request.url.params.get("partNumber")
        with self._lock:
            self.bodies.append(body)
            if part is None:
                status = self.statuses.pop(0) if self.statuses else 200
                etag = f'"etag-{len(self.bodies)}"'
            else:
                self.parts.setdefault(int(part), []).append(body)
                status = self.failing_parts.pop(int(part), 200)
                etag = f'"etag-{part}"'
        return httpx.Response(status, headers={"ETag": etag})


def upload(tmp_path, storage: FlakyStorage, target: dict) -> ck.Uploaded:
    plan = ck.plan_tar(make_checkpoint(tmp_path / "ckpt"))
    with httpx.Client(transport=httpx.MockTransport(storage)) as client:
        return ck.upload_object(
            client, target, plan.size, lambda: ck.object_pieces(plan, None),
            cancel=threading.Event(), counter=ck.ByteCounter(),
        )  # fmt: skip


def test_a_failed_single_put_is_retried_with_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.checkpoints.upload.RETRY_BASE_S", 0.01)
    storage = FlakyStorage(500, 503)
    done = upload(tmp_path, storage, {"kind": "single", "url": "http://s3/x", "headers": {}})
    assert len(storage.bodies) == 3
    assert len(set(storage.bodies)) == 1
    assert done.sha256 == hashlib.sha256(storage.bodies[-1]).hexdigest()


@pytest.mark.parametrize("status", [403, 410])  # expired; refused for an ended attempt
def test_an_expired_url_is_not_retried_but_reported(tmp_path, status):
    storage = FlakyStorage(status)
    with pytest.raises(ck.StorageError) as caught:
        upload(tmp_path, storage, {"kind": "single", "url": "http://s3/x", "headers": {}})
    assert caught.value.expired
    assert len(storage.bodies) == 1


def test_multipart_sends_fixed_size_parts_and_returns_their_etags(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.checkpoints.upload.RETRY_BASE_S", 0.01)
    plan = ck.plan_tar(make_checkpoint(tmp_path / "probe"))
    part_size = 4096
    count = -(-plan.size // part_size)
    parts = [{"part_number": n, "url": f"http://s3/x?partNumber={n}"} for n in range(1, count + 1)]
    storage = FlakyStorage(failing_parts={2: 500})  # the second part fails once

    done = upload(tmp_path, storage, {"kind": "multipart", "part_size": part_size, "parts": parts})

    assert len(storage.parts[2]) == 2
    assert storage.parts[2][0] == storage.parts[2][1]  # the retry sent the same bytes
    stored = [storage.parts[n][-1] for n in range(1, count + 1)]
    assert [len(b) for b in stored[:-1]] == [part_size] * (count - 1)
    assert done.sha256 == hashlib.sha256(b"".join(stored)).hexdigest()
    assert [p["part_number"] for p in done.parts] == list(range(1, count + 1))
    assert [p["etag"] for p in done.parts] == [f'"etag-{n}"' for n in range(1, count + 1)]


def test_multipart_puts_several_parts_at_once_but_no_more_than_the_limit(tmp_path):
    plan = ck.plan_tar(make_checkpoint(tmp_path / "probe"))
    part_size = 1024
    count = -(-plan.size // part_size)
    assert count > ck.PARTS_IN_FLIGHT
    parts = [{"part_number": n, "url": f"http://s3/x?partNumber={n}"} for n in range(1, count + 1)]
    # The first parts meet here: sent one after the other, the first would wait in vain.
    together = threading.Barrier(ck.PARTS_IN_FLIGHT, timeout=10)
    in_flight, most = [0], [0]
    lock = threading.Lock()
    storage = FlakyStorage()

    def transport(request: httpx.Request) -> httpx.Response:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        if int(request.url.params["partNumber"]) <= ck.PARTS_IN_FLIGHT:
            together.wait()
        try:
            return storage(request)
        finally:
            with lock:
                in_flight[0] -= 1

    done = upload(
        tmp_path, transport, {"kind": "multipart", "part_size": part_size, "parts": parts}
    )

    assert most[0] == ck.PARTS_IN_FLIGHT
    stored = b"".join(storage.parts[n][-1] for n in range(1, count + 1))
    assert done.sha256 == hashlib.sha256(stored).hexdigest()
    assert [p["part_number"] for p in done.parts] == list(range(1, count + 1))


def test_when_uploads_fall_behind_only_the_newest_pending_checkpoint_is_shipped(tmp_path):
    import threading

    from agent.uploader import Uploader

    for step in (10, 20, 30):
        make_checkpoint(tmp_path / f"checkpoint-{step}", step=step)
    shipped: list[int] = []
    uploader = Uploader(
        api=None,
        storage=None,
        checkpoint_dir=tmp_path,
        data_key=None,
        counter=None,
        fenced=threading.Event(),
        on_token_dead=lambda: None,
    )

    def ship(ready) -> None:
        shipped.append(ready.step)
        uploader._handled.add((ready.path.name, ready.step))

    uploader._ship = ship
    uploader.start()

    assert uploader.finish(timeout=10)
    assert shipped == [30]
