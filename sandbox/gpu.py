"""The fake ``nvidia-smi`` put first on every instance's PATH.

It reads ``gpu.json`` in the instance's scratch folder on every call, so a ``gpu-fault``
injection takes effect at once: ``error`` makes it fail the way a GPU that fell off the bus
does (exit 255, "Unable to determine the device handle ..."), ``hang`` makes it block
forever, as the real tool does on a wedged driver, and ``lost:N`` makes GPU N fall off the
bus: every call then prints only "Unable to determine the device handle for GPU0000:0N:00.0:
GPU is lost.  Reboot the system to recover this GPU" and exits 15 (NVML_ERROR_GPU_IS_LOST),
the healthy GPUs unlisted, as the real tool does (XuehaiPan/nvitop#45, wookayin/gpustat#125).
Optional files the training script may write, ``$SANDBOX_DIR/gpu_util`` and
``$SANDBOX_DIR/gpu_mem_used`` (numbers), feed the utilization and memory columns; otherwise the
GPU reads as idle.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

FAULT_MESSAGE = "Unable to determine the device handle for GPU 0000:01:00.0: Unknown Error"

SCRIPT = r"""
import json, os, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
UNITS = {"utilization.gpu": "%", "memory.used": "MiB", "memory.total": "MiB"}
LOST = ("Unable to determine the device handle for GPU{bus}: GPU is lost.  "
        "Reboot the system to recover this GPU")


def read(name, default):
    try:
        return float((HERE / name).read_text().strip())
    except (OSError, ValueError):
        return default


def values(gpu, index):
    util = read("gpu_util", 0.0)
    return {
        "index": str(index), "name": gpu["name"], "uuid": f"GPU-sandbox-{gpu['instance']}-{index}",
        "driver_version": gpu["driver_version"], "utilization.gpu": f"{util:.0f}",
        "memory.used": f"{read('gpu_mem_used', 0.0):.0f}", "memory.total": str(gpu["memory_total"]),
        "memory.free": str(int(gpu["memory_total"] - read("gpu_mem_used", 0.0))),
        "temperature.gpu": f"{34 + util * 0.4:.0f}", "pci.bus_id": f"00000000:{index + 1:02X}:00.0",
        # GeForce cards have no ECC: nvidia-smi prints [N/A] there.
        "ecc.errors.uncorrected.volatile.total": "[N/A]" if "GeForce" in gpu["name"] else "0",
    }


def cell(name, value, opts):
    return value if "nounits" in opts or name not in UNITS else f"{value} {UNITS[name]}"


def header(name, opts):
    return name if "nounits" in opts or name not in UNITS else f"{name} [{UNITS[name]}]"


def query(gpu, args):
    wanted = next(a for a in args if a.startswith("--query-gpu=")).split("=", 1)[1]
    fields = [f.strip() for f in wanted.split(",") if f.strip()]
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv")
    opts = set(fmt.split(","))
    for f in fields:
        if f not in values(gpu, 0):
            print(f'Field "{f}" is not a valid field to query.\n', file=sys.stderr)
            return 2
    if "noheader" not in opts:
        print(", ".join(header(f, opts) for f in fields))
    for i in range(gpu["count"]):
        row = values(gpu, i)
        print(", ".join(cell(f, row[f], opts) for f in fields))
    return 0


def table(gpu):
    driver = gpu["driver_version"]
    print(f"NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {gpu['cuda']}")
    for i in range(gpu["count"]):
        v = values(gpu, i)
        memory = f"{v['memory.used']}MiB / {v['memory.total']}MiB"
        print(f"|  {i}  {v['name']:<28} | {v['pci.bus_id']} | {memory} | {v['utilization.gpu']}% |")
    return 0


def main(args):
    gpu = json.loads((HERE / "gpu.json").read_text())
    if gpu.get("fault") == "hang":
        while True:
            time.sleep(3600)
    if gpu.get("fault") == "error":
        print(FAULT_MESSAGE)
        return 255
    if gpu.get("fault", "").startswith("lost:"):
        index = int(gpu["fault"].split(":", 1)[1])
        print(LOST.format(bus=f"0000:{index + 1:02X}:00.0"))
        return 15
    if "-L" in args or "--list-gpus" in args:
        for i in range(gpu["count"]):
            print(f"GPU {i}: {gpu['name']} (UUID: GPU-sandbox-{gpu['instance']}-{i})")
        return 0
    if any(a.startswith("--query-gpu=") for a in args):
        return query(gpu, args)
    return table(gpu)


sys.exit(main(sys.argv[1:]))
"""


def marketing_name(gpu_name: str) -> str:
    """Vast's model name → nvidia-smi's (``RTX 4090`` → ``NVIDIA GeForce RTX 4090``)."""
    consumer = gpu_name.startswith(("GTX", "RTX 2", "RTX 3", "RTX 4", "RTX 5"))
    return f"NVIDIA GeForce {gpu_name}" if consumer else f"NVIDIA {gpu_name}"


def install(scratch: Path, instance_id: int, offer: dict) -> None:
    """Write ``bin/nvidia-smi`` and its ``gpu.json`` into an instance's scratch folder."""
    (scratch / "bin").mkdir(parents=True, exist_ok=True)
    tool = scratch / "bin" / "nvidia-smi"
    header = f"#!{sys.executable} -I\nFAULT_MESSAGE = {FAULT_MESSAGE!r}\n"
    tool.write_text(header + SCRIPT)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    write_state(scratch, instance_id, offer, fault="")


def write_state(scratch: Path, instance_id: int, offer: dict, fault: str) -> None:
    """(Re)write ``gpu.json``; ``fault`` is '', 'error', 'hang' or 'lost:N' (GPU N)."""
    state = {
        "instance": instance_id,
        "name": marketing_name(str(offer.get("gpu_name", "GPU"))),
        "count": int(offer.get("num_gpus", 1)),
        "memory_total": int(offer.get("gpu_ram", 0)),
        "driver_version": str(offer.get("driver_version", "550.54.14")),
        "cuda": offer.get("cuda_max_good", 12.4),
        "fault": fault,
    }
    tmp = scratch / "gpu.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(scratch / "gpu.json")  # atomic: a concurrent nvidia-smi never reads half a file
