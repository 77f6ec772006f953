"""GPU health from nvidia-smi: a real subprocess each time, with stand-ins first on PATH."""

from __future__ import annotations

import time

import pytest

from agent.gpu import query_gpus


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """Install a stand-in nvidia-smi with the given shell body, first on PATH."""
    monkeypatch.delenv("NOMAD_NVIDIA_SMI", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    def install(body: str) -> None:
        script = tmp_path / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)

    return install


def test_every_gpu_readable_is_healthy(nvidia_smi):
    nvidia_smi(
        "echo 'NVIDIA GeForce RTX 4090, 97, 20123, 24564, 61'\n"
        "echo 'NVIDIA GeForce RTX 4090, [N/A], 3, 24564, [Not Supported]'"
    )
    assert query_gpus() == {"ok": True, "error": None}


def test_a_failing_nvidia_smi_is_unhealthy_with_its_message(nvidia_smi):
    nvidia_smi("echo 'Unable to determine the device handle for GPU0: Unknown Error' >&2; exit 15")
    reading = query_gpus()
    assert reading["ok"] is False
    assert "exited with 15" in reading["error"]
    assert "Unknown Error" in reading["error"]


def test_a_hanging_nvidia_smi_is_unhealthy_and_does_not_hang_us(nvidia_smi):
    nvidia_smi("sleep 60")  # the child keeps the pipes open: the whole group must be killed
    started = time.monotonic()
    reading = query_gpus(timeout_s=0.5)
    assert reading["ok"] is False
    assert "did not answer within 0.5s" in reading["error"]
    assert time.monotonic() - started < 10


def test_a_missing_nvidia_smi_is_reported_as_not_found(nvidia_smi):
    assert query_gpus() == {"ok": False, "error": "nvidia-smi not found"}


@pytest.mark.parametrize("output", ["", "garbage without commas", "GPU, x, y, z, w"])
def test_unreadable_output_is_unhealthy(nvidia_smi, output):
    nvidia_smi(f"echo '{output}'")
    assert query_gpus()["ok"] is False
