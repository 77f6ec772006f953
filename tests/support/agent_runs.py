"""The real agent's runs against the fake supervisor, read back: the steps its heartbeats
reported, the members of a checkpoint's tarball, whether a process group is gone; and the fake S3
a test module's runs share (``s3``: a plugin, so tests/ and tests/hf/ both have it; a module with
an ``s3`` fixture of its own keeps it)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from tests.support.agent_fake_supervisor import FakeS3


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server, one per module: starting it is most of a short test's time."""
    server = FakeS3()
    yield server
    server.close()


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def steps_seen(attempt) -> list[int]:
    return [h["step"] for h in attempt.heartbeats if h["step"] is not None]


def group_is_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False
