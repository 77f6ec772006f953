"""GPU health from nvidia-smi, polled in a thread so a hung driver never delays a heartbeat.

One reading is ``{ok, error, gpus}``: a row per GPU nvidia-smi lists (index, PCI bus id, name,
utilisation, memory, temperature, uncorrected ECC errors) and whether the host can train.

What an unprivileged container can read, and why this is what counts:

- A GPU that fell off the bus makes nvidia-smi fail as a whole, for every GPU, with
  "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  Reboot the system
  to recover this GPU" (older drivers print "GPU 0000:..." with a space) and exit code 15,
  NVML's NVML_ERROR_GPU_IS_LOST ("The GPU has fallen off the bus or has otherwise become
  inaccessible", nvml.h; the man page's RETURN VALUE lists the same codes). The healthy GPUs
  are not listed then (XuehaiPan/nvitop#45, wookayin/gpustat#125): the bus id in the message is
  the only clue, so the monitor keeps the last good rows to name the GPU by its index.
- A GPU the host no longer shows at all is simply missing from the list: fewer rows than the
  job's ``num_gpus`` (the assignment) is the same fault.
- A value NVML cannot read prints as ``[N/A]`` or ``[Not Supported]`` (no fault); one that
  fails with NVML_ERROR_GPU_IS_LOST or NVML_ERROR_RESET_REQUIRED prints as ``[GPU is lost]``
  or ``[GPU requires reset]``: that GPU is lost.
- Xid errors ("NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus") are kernel log
  lines, not nvidia-smi fields: reading them needs the host's dmesg or syslog (root, or
  CAP_SYSLOG where kernel.dmesg_restrict is set), which a rented container does not have.
  What nvidia-smi offers instead is ``ecc.errors.uncorrected.volatile.total`` (the double-bit
  errors behind Xid 48; ``[N/A]`` on GeForce cards): it is reported, shown on the job page,
  and not a fault by itself, because the count may predate the rent (it resets only when the
  driver reloads).
- The query names only fields that old and new drivers alike know: one field the installed
  driver lacks fails the whole call ('Field "..." is not a valid field to query.'), which would
  read as a GPU fault on every host with that driver. That rules out e.g.
  ``clocks_event_reasons.*``, the newer drivers' name for ``clocks_throttle_reasons.*``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from typing import Any

QUERY = (
    "index,pci.bus_id,name,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "ecc.errors.uncorrected.volatile.total"
)
DEFAULT_TIMEOUT_S = 10.0
MAX_GPUS = 16  # the supervisor refuses more (jobs.spec: num_gpus ≤ 16)
# NVML's errors that mean the GPU itself is gone, as nvidia-smi prints them in a field.
LOST_VALUES = {"[GPU is lost]", "[GPU requires reset]"}
LOST_MESSAGE = re.compile(
    r"Unable to determine the device handle for GPU ?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:\s*(?P<why>[^\n]*)"
)


def nvidia_smi_command() -> str:
    # NOMAD_NVIDIA_SMI lets a sandbox (or a test) point at a stand-in binary.
    return os.environ.get("NOMAD_NVIDIA_SMI") or "nvidia-smi"


def query_gpus(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    expected: int | None = None,
    known: list[dict[str, Any]] | tuple = (),
) -> dict[str, Any]:
    """One nvidia-smi reading as the heartbeat's ``gpu`` object: {ok, error, gpus}.

    EXPECTED is how many GPUs the job has (fewer listed is a fault; None: not known yet);
    KNOWN, the rows of the last healthy reading, names a GPU that has gone by its index."""
    binary = shutil.which(nvidia_smi_command())
    if binary is None:
        return unhealthy("nvidia-smi not found")
    args = [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
    try:
        code, out, err = _run_with_timeout(args, timeout_s)
    except subprocess.TimeoutExpired:
        return unhealthy(f"nvidia-smi did not answer within {timeout_s:g}s")
    except OSError as exc:
        return unhealthy(f"nvidia-smi could not run: {exc}")
    if code != 0:
        return failed_reading(code, out, err, known)
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        gpus = [parse_line(line) for line in lines[:MAX_GPUS]]
    except ValueError as exc:
        return unhealthy(f"nvidia-smi output not understood: {exc}")
    if not gpus:
        return unhealthy("nvidia-smi lists no GPUs")
    return judge(gpus, expected, known)


def unhealthy(error: str, gpus: list[dict[str, Any]] | tuple = ()) -> dict[str, Any]:
    return {"ok": False, "error": error, "gpus": list(gpus)}


def failed_reading(
    code: int, out: str, err: str, known: list[dict[str, Any]] | tuple
) -> dict[str, Any]:
    """nvidia-smi exited non-zero: a GPU that fell off the bus when its message says so (named
    by its index where an earlier reading knew its bus id), else the message itself."""
    lost = LOST_MESSAGE.search(f"{err}\n{out}")
    if lost is None:
        text = (err.strip() or out.strip() or "no output")[-500:]
        return unhealthy(f"nvidia-smi exited with {code}: {text}")
    bus, why = lost["bus"], lost["why"].strip() or "unreachable"
    row = next((g for g in known if same_bus(g["pci_bus_id"], bus)), None)
    index = row["index"] if row else None
    gone = {**(row or empty_row(bus)), "error": f"lost: {why}"[:300]}
    return unhealthy(
        f"{describe(index, bus)} is lost: {why} (nvidia-smi exited with {code})", [gone]
    )


def judge(
    gpus: list[dict[str, Any]], expected: int | None, known: list[dict[str, Any]] | tuple
) -> dict[str, Any]:
    """A readable listing is healthy unless a GPU in it is lost or the job's GPUs are not all
    there."""
    for gpu in gpus:
        if gpu["error"]:
            where = describe(gpu["index"], gpu["pci_bus_id"])
            return unhealthy(f"{where} is {gpu['error']}", gpus)
    if expected is not None and len(gpus) < expected:
        listed = [g["pci_bus_id"] for g in gpus]
        missing = [g for g in known if not any(same_bus(g["pci_bus_id"], b) for b in listed)]
        of = f"nvidia-smi lists {len(gpus)} of the job's {expected} GPUs"
        gone = missing[0] if missing else None
        which = describe(gone["index"], gone["pci_bus_id"]) if gone else "a GPU"
        return unhealthy(f"{which} is missing: {of}", gpus)
    return {"ok": True, "error": None, "gpus": gpus}


def describe(index: int | None, bus: str) -> str:
    """'GPU 1 (0000:41:00.0)', or 'GPU 0000:41:00.0' when its index is not known."""
    return f"GPU {index} ({short_bus(bus)})" if index is not None else f"GPU {short_bus(bus)}"


def short_bus(bus: str) -> str:
    """The bus id with a 4-digit domain, as the driver's messages write it ('00000000:41:00.0'
    in a query is '0000:41:00.0' there)."""
    domain, _, rest = bus.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if rest else bus
    except ValueError:
        return bus


def same_bus(a: str, b: str) -> bool:
    return short_bus(a).upper() == short_bus(b).upper()


def empty_row(bus: str) -> dict[str, Any]:
    return {
        "index": None,
        "pci_bus_id": bus,
        "name": "",
        "utilization_pct": None,
        "memory_used_mib": None,
        "memory_total_mib": None,
        "temperature_c": None,
        "ecc_uncorrected": None,
        "error": None,
    }


def parse_line(line: str) -> dict[str, Any]:
    """One GPU from a line of QUERY, e.g. '1, 00000000:41:00.0, NVIDIA GeForce RTX 4090, 97,
    20123, 24564, 61, [N/A]' (a number may be "[N/A]" or "[Not Supported]"); ValueError when
    the line is something else (a driver in trouble prints other things)."""
    head = [field.strip() for field in line.split(",", 2)]
    if len(head) != 3:
        raise ValueError(f"{line.strip()[:100]!r} is not 8 fields")
    rest = [field.strip() for field in head[2].rsplit(",", 5)]
    if len(rest) != 6:
        raise ValueError(f"{line.strip()[:100]!r} is not 8 fields")
    index, bus = head[0], head[1][:32]
    name, util, used, total, temp, ecc = rest
    fields = [index, bus, *rest]
    lost = next((f for f in fields if f in LOST_VALUES), None)
    errors = number(ecc)
    return {
        "index": int(index) if lost is None or index.isdigit() else None,
        "pci_bus_id": bus if bus not in LOST_VALUES else "",
        "name": name[:100] if name not in LOST_VALUES else "",
        "utilization_pct": number(util),
        "memory_used_mib": number(used),
        "memory_total_mib": number(total),
        "temperature_c": number(temp),
        "ecc_uncorrected": int(errors) if errors is not None else None,
        "error": f"lost: {lost.strip('[]')}" if lost else None,
    }


def number(text: str) -> float | None:
    """A field's number; None where nvidia-smi has none ("[N/A]", "[Not Supported]", …)."""
    if text.startswith("[") or text in {"", "N/A"}:
        return None
    return float(text)


def _run_with_timeout(args: list[str], timeout_s: float) -> tuple[int, str, str]:
    # Own session, so the whole group (a wrapper script and whatever it started) can be killed;
    # after the kill, wait only briefly: a process stuck in the driver may never die.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=2)  # else leave it: a process stuck in the driver
        raise
    return proc.returncode, out, err


class GpuMonitor:
    """Keeps the latest reading; ``latest`` is None until the first reading finishes.

    ``expected_gpus`` is the job's GPU count once register has said it (None before); the
    last healthy reading's rows are kept to name a GPU that goes missing or is lost."""

    def __init__(self, interval_s: float = 15.0, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.expected_gpus: int | None = None
        self.latest: dict[str, Any] | None = None
        self._known: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)

    def read(self) -> dict[str, Any]:
        """One reading now (in the caller's thread), remembered as the known GPUs if healthy."""
        reading = query_gpus(self.timeout_s, expected=self.expected_gpus, known=self._known)
        if reading["ok"]:
            self._known = reading["gpus"]
        return reading

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.latest = self.read()
            self._stop.wait(self.interval_s)
