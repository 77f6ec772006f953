"""GPU health from nvidia-smi: a real subprocess each time, with stand-ins first on PATH."""

from __future__ import annotations

import time

import pytest

from agent.assignment import parse_assignment
from agent.gpu import GpuMonitor, query_gpus

GPU0 = "0, 00000000:01:00.0, NVIDIA GeForce RTX 4090, 97, 20123, 24564, 61, [N/A]"
GPU1 = "1, 00000000:41:00.0, NVIDIA GeForce RTX 4090, [N/A], 3, 24564, [Not Supported], [N/A]"
# What nvidia-smi prints, and nothing else, once one GPU fell off the bus (exit 15).
LOST_1 = (
    "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  "
    "Reboot the system to recover this GPU"
)


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


def lines(*rows: str) -> str:
    return "\n".join(f"echo '{row}'" for row in rows)


def test_every_gpu_readable_is_healthy_with_a_row_each(nvidia_smi):
    nvidia_smi(lines(GPU0, GPU1))
    reading = query_gpus(expected=2)
    assert (reading["ok"], reading["error"]) == (True, None)
    assert reading["gpus"] == [
        {
            "index": 0,
            "pci_bus_id": "00000000:01:00.0",
            "name": "NVIDIA GeForce RTX 4090",
            "utilization_pct": 97.0,
            "memory_used_mib": 20123.0,
            "memory_total_mib": 24564.0,
            "temperature_c": 61.0,
            "ecc_uncorrected": None,
            "error": None,
        },
        {
            "index": 1,
            "pci_bus_id": "00000000:41:00.0",
            "name": "NVIDIA GeForce RTX 4090",
            "utilization_pct": None,
            "memory_used_mib": 3.0,
            "memory_total_mib": 24564.0,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "error": None,
        },
    ]


def test_the_query_asks_for_the_bus_id_and_ecc_errors(nvidia_smi, tmp_path):
    nvidia_smi(f'echo "$@" > {tmp_path}/args\n{lines(GPU0)}')
    query_gpus()
    args = (tmp_path / "args").read_text()
    assert "index,pci.bus_id,name," in args
    assert "ecc.errors.uncorrected.volatile.total" in args
    assert "--format=csv,noheader,nounits" in args


def test_uncorrected_ecc_errors_are_reported_not_a_fault(nvidia_smi):
    nvidia_smi(lines("0, 00000000:01:00.0, NVIDIA H100 80GB HBM3, 100, 70000, 81559, 55, 2"))
    reading = query_gpus(expected=1)
    assert reading["ok"] is True
    assert reading["gpus"][0]["ecc_uncorrected"] == 2


def test_a_gpu_fallen_off_the_bus_is_named_by_its_index_from_the_last_good_reading(
    nvidia_smi,
):
    monitor = GpuMonitor(timeout_s=5)
    monitor.expected_gpus = 2
    nvidia_smi(lines(GPU0, GPU1))
    assert monitor.read()["ok"] is True
    nvidia_smi(f"echo '{LOST_1}'; exit 15")
    reading = monitor.read()
    assert reading["ok"] is False
    assert reading["error"] == (
        "GPU 1 (0000:41:00.0) is lost: GPU is lost.  Reboot the system to recover this GPU "
        "(nvidia-smi exited with 15)"
    )
    assert [(g["index"], g["pci_bus_id"]) for g in reading["gpus"]] == [(1, "00000000:41:00.0")]
    assert reading["gpus"][0]["error"].startswith("lost: GPU is lost.")


def test_a_lost_gpu_with_no_earlier_reading_is_named_by_its_bus(nvidia_smi):
    # Older drivers put a space before the bus id.
    message = "Unable to determine the device handle for GPU 0000:02:00.0: Unknown Error"
    nvidia_smi(f"echo '{message}'; exit 255")
    reading = query_gpus(expected=2)
    assert reading["ok"] is False
    assert reading["error"].startswith("GPU 0000:02:00.0 is lost: Unknown Error")
    assert reading["gpus"][0]["index"] is None


def test_fewer_gpus_than_the_job_has_is_unhealthy_naming_the_missing_one(nvidia_smi):
    monitor = GpuMonitor(timeout_s=5)
    monitor.expected_gpus = 2
    nvidia_smi(lines(GPU0, GPU1))
    assert monitor.read()["ok"] is True
    nvidia_smi(lines(GPU0))
    reading = monitor.read()
    assert reading["ok"] is False
    assert reading["error"] == (
        "GPU 1 (0000:41:00.0) is missing: nvidia-smi lists 1 of the job's 2 GPUs"
    )
    assert [g["index"] for g in reading["gpus"]] == [0]


def test_fewer_gpus_than_expected_at_the_first_reading_is_unhealthy(nvidia_smi):
    nvidia_smi(lines(GPU0))
    reading = query_gpus(expected=2)
    assert reading["ok"] is False
    assert reading["error"] == "a GPU is missing: nvidia-smi lists 1 of the job's 2 GPUs"
    assert query_gpus(expected=None)["ok"] is True  # before register says how many


def test_a_gpu_whose_values_read_as_lost_is_unhealthy(nvidia_smi):
    lost = "1, 00000000:41:00.0, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], "
    nvidia_smi(lines(GPU0, lost + "[GPU is lost], [GPU is lost]"))
    reading = query_gpus(expected=2)
    assert reading["ok"] is False
    assert reading["error"] == "GPU 1 (0000:41:00.0) is lost: GPU is lost"
    assert reading["gpus"][1]["error"] == "lost: GPU is lost"


def test_a_failing_nvidia_smi_is_unhealthy_with_its_message(nvidia_smi):
    nvidia_smi("echo 'Unable to determine the device handle for GPU0: Unknown Error' >&2; exit 15")
    reading = query_gpus()
    assert reading["ok"] is False
    assert "exited with 15" in reading["error"]
    assert "Unknown Error" in reading["error"]
    assert reading["gpus"] == []


def test_a_hanging_nvidia_smi_is_unhealthy_and_does_not_hang_us(nvidia_smi):
    nvidia_smi("sleep 60")  # the child keeps the pipes open: the whole group must be killed
    started = time.monotonic()
    reading = query_gpus(timeout_s=0.5)
    assert reading["ok"] is False
    assert "did not answer within 0.5s" in reading["error"]
    assert time.monotonic() - started < 10


def test_a_missing_nvidia_smi_is_reported_as_not_found(nvidia_smi):
    assert query_gpus() == {"ok": False, "error": "nvidia-smi not found", "gpus": []}


@pytest.mark.parametrize(
    "output",
    [
        "",
        "garbage without commas",
        "GPU, x, y, z, w",
        "NVIDIA GeForce RTX 4090, 97, 20123, 24564, 61",  # the old five fields
        "x, 00000000:01:00.0, NVIDIA GeForce RTX 4090, 97, 20123, 24564, 61, [N/A]",
    ],
)
def test_unreadable_output_is_unhealthy(nvidia_smi, output):
    nvidia_smi(f"echo '{output}'")
    assert query_gpus()["ok"] is False


BASE_REPLY = {"job_id": 1, "attempt_no": 1, "command": "python train.py"}


def test_register_without_num_gpus_means_one_gpu():
    assert parse_assignment(BASE_REPLY).num_gpus == 1
    assert parse_assignment({**BASE_REPLY, "num_gpus": 4}).num_gpus == 4


@pytest.mark.parametrize("bad", [0, 17, "2", 1.5, True])
def test_register_with_an_impossible_num_gpus_is_malformed(bad):
    with pytest.raises(ValueError, match="num_gpus"):
        parse_assignment({**BASE_REPLY, "num_gpus": bad})
