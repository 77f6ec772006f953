"""Benchmark: checkpoint restore (download + verify + unpack) over a simulated link, the old
sequential path against parallel ranged GETs with unpacking that follows the download.

Usage: ``python bench/restore.py [--quick] [--mb N] [--repeats R] [--link-mbit L]
[--stream-mbit S] [--ttfb-ms T] [--connections C] [--kinds plain,encrypted]``.
Default: a 1024 MB checkpoint, median of 3 runs of each path for a plain and an ngck1 object
(about 6 minutes: at a 500 Mbit/s cap the parallel path alone needs 17 s per run, the
sequential one 34 s at the assumed per-stream rate, times 3 runs times 2 kinds); ``--quick``:
256 MB, one run (about 30 s).

A storage server (a subprocess: its threads do not compete with the agent's for the GIL) serves
the object over HTTP/1.1 keep-alive with ``Range`` support and paces what it sends: each TCP
connection to S (Mbit/s) and all of them together to the host's link L, and each response waits
T ms before its first byte (a request's round trip plus the store's first-byte latency).

The assumption is S: one TCP stream gets at most its receive window per round trip. Linux's
default ``tcp_rmem`` maximum is 6 MiB, of which about half is advertised window; from a bucket
in another region to a community host the round trip is ~100 ms, so 3 MiB / 100 ms = 252 Mbit/s,
and S defaults to 250 (T to 120 ms, one such round trip and 20 ms at the store). Loss only
lowers it; a bucket near the host raises it. At S >= L one stream already fills the link and
parallel GETs buy nothing; what is left is the unpacking that now overlaps the download.

- old: a frozen copy of the agent's path before ranged GETs (``download_verified`` then
  ``unpack``: one GET, hashed while written, then the file is read back and unpacked).
- new: ``agent.checkpoints.restore``: C connections GET 16 MB ranges in order into their place
  in the file; the contiguous prefix is hashed and unpacked as it arrives.

Every restore is checked against the original files' sha256. Printed per kind: download, the
unpacking left after the last byte, and the total (median of R; ratio = new / old; goal: the
total's ratio <= 0.5).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402

GOAL = 0.5
SEND_CHUNK = 64 * 1024
BURST = 256 * 1024  # bytes a pacer lets through at once


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MB, one run")
    parser.add_argument("--mb", type=int, help="checkpoint size in MB (default 1024; quick 256)")
    parser.add_argument("--repeats", type=int, help="runs of each path (default 3; quick 1)")
    parser.add_argument("--link-mbit", type=float, default=500.0, help="the host's link cap")
    parser.add_argument("--stream-mbit", type=float, default=250.0, help="one TCP stream's cap")
    parser.add_argument("--ttfb-ms", type=float, default=120.0, help="wait before each answer")
    parser.add_argument("--connections", type=int, default=4, help="the new path's connections")
    parser.add_argument("--kinds", default="plain,encrypted", help="plain, encrypted or both")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run the storage server
    args = parser.parse_args()
    args.mb = args.mb or (256 if args.quick else 1024)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.kinds = [kind for kind in args.kinds.split(",") if kind]
    return args


# --- the storage server (its own process) ----------------------------------------------------


class Pacer:
    """A token bucket (as GCRA): ``reserve(n)`` says when N more bytes may go out."""

    def __init__(self, mbit: float) -> None:
        self.rate = mbit * 1e6 / 8
        self.tolerance = BURST / self.rate
        self.tat = 0.0
        self.lock = threading.Lock()

    def wait(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            tat = max(self.tat, now)
            self.tat = tat + n / self.rate
        delay = tat - self.tolerance - now
        if delay > 0:
            time.sleep(delay)


class StorageHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.stream = Pacer(self.server.stream_mbit)  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        path = Path(self.server.folder, self.path.split("?")[0].lstrip("/"))  # type: ignore[attr-defined]
        size = path.stat().st_size
        start, end, status = 0, size, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start, status = int(match[1]), 206
            end = min(int(match[2]) + 1, size) if match[2] else size
        time.sleep(self.server.ttfb_s)  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        link: Pacer = self.server.link  # type: ignore[attr-defined]
        fd = os.open(path, os.O_RDONLY)
        try:
            pos = start
            while pos < end:
                n = min(SEND_CHUNK, end - pos)
                self.stream.wait(n)  # this connection's own cap first, then the shared link
                link.wait(n)
                self.wfile.write(os.pread(fd, n, pos))
                pos += n
        finally:
            os.close(fd)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(args: argparse.Namespace) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StorageHandler)
    server.daemon_threads = True
    server.folder = args.serve  # type: ignore[attr-defined]
    server.stream_mbit = args.stream_mbit  # type: ignore[attr-defined]
    server.link = Pacer(args.link_mbit)  # type: ignore[attr-defined]
    server.ttfb_s = args.ttfb_ms / 1000  # type: ignore[attr-defined]
    print(server.server_port, flush=True)
    server.serve_forever()


def start_server(args: argparse.Namespace, folder: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, __file__, "--serve", str(folder)]
    command += ["--link-mbit", str(args.link_mbit), "--stream-mbit", str(args.stream_mbit)]
    command += ["--ttfb-ms", str(args.ttfb_ms)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    return proc, f"http://127.0.0.1:{port}"


# --- the checkpoint and its objects ----------------------------------------------------------


def make_checkpoint(folder: Path, mb: int) -> dict[str, str]:
    """MB megabytes of random files (like upload.py's); returns each file's sha256."""
    rng = random.Random(300)
    folder.mkdir(parents=True)
    sizes = {"optimizer.pt": mb // 2, "adapter_model-1.safetensors": mb - mb // 2 - mb // 4}
    sizes["adapter_model-2.safetensors"] = mb // 4
    hashes = {}
    for name, size in sizes.items():
        digest = hashlib.sha256()
        with (folder / name).open("wb") as out:
            for _ in range(size // 8):
                piece = rng.randbytes(8 * 1024 * 1024)
                digest.update(piece)
                out.write(piece)
        hashes[name] = digest.hexdigest()
    for name, text in {
        "trainer_state.json": '{"global_step": 300}\n' * 50,
        "adapter_config.json": '{"r": 16, "lora_alpha": 32}\n',
    }.items():
        (folder / name).write_text(text)
        hashes[name] = hashlib.sha256(text.encode()).hexdigest()
    return hashes


def write_object(folder: Path, dest: Path, crypt: dict[str, Any] | None) -> dict[str, Any]:
    from agent import checkpoints as ck

    digest = hashlib.sha256()
    with dest.open("wb") as out:
        for piece in ck.object_pieces(ck.plan_tar(folder), crypt):
            digest.update(piece)
            out.write(piece)
    return {"name": dest.name, "size": dest.stat().st_size, "sha256": digest.hexdigest()}


def check_restored(restored: Path, hashes: dict[str, str]) -> None:
    found = {}
    for path in restored.iterdir():
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while piece := f.read(8 * 1024 * 1024):
                digest.update(piece)
        found[path.name] = digest.hexdigest()
    if found != hashes:
        raise AssertionError(f"restored files differ from the original: {sorted(found)}")


# --- the old path, frozen as it was before ranged GETs ---------------------------------------


def old_download_verified(storage: Any, obj: dict[str, Any], dest: Path, *, counter: Any) -> None:
    """agent.checkpoints.download_verified before ranged GETs: one GET, hashed as written."""
    from agent.checkpoints import READ_CHUNK, RestoreError

    digest = hashlib.sha256()
    got = 0
    with storage.stream("GET", obj["url"]) as response, dest.open("wb") as out:
        if response.status_code != 200:
            raise RestoreError(f"GET answered {response.status_code}")
        for piece in response.iter_bytes(READ_CHUNK):
            digest.update(piece)
            out.write(piece)
            got += len(piece)
            counter.add(down=len(piece))
    if got != int(obj["size"]) or digest.hexdigest() != obj["sha256"]:
        raise RestoreError("the downloaded checkpoint's size or sha256 does not match")


def old_unpack(archive: Path, target: Path, *, data_key: bytes | None) -> None:
    """agent.checkpoints.unpack before ranged GETs (it is unchanged): read back, unpack."""
    from agent.checkpoints.archives import extract_object

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with archive.open("rb") as raw:
        extract_object(raw, partial, data_key)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


# --- the runs --------------------------------------------------------------------------------


def storage_client() -> Any:
    import httpx

    return httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0))  # as agent/state.py


def run_old(tmp: Path, obj: dict[str, Any], key: bytes | None) -> tuple[float, float, int]:
    from agent import checkpoints as ck

    counter = ck.ByteCounter()
    archive = tmp / ".resume-300.download"
    with storage_client() as storage:
        t0 = time.perf_counter()
        old_download_verified(storage, obj, archive, counter=counter)
        t1 = time.perf_counter()
        old_unpack(archive, tmp / "resume-300", data_key=key)
        t2 = time.perf_counter()
    archive.unlink()
    return t1 - t0, t2 - t1, counter.down


def run_new(
    tmp: Path, obj: dict[str, Any], key: bytes | None, connections: int
) -> tuple[float, float, int]:
    from agent import checkpoints as ck

    counter = ck.ByteCounter()
    with storage_client() as storage:
        stats = ck.restore(
            storage,
            obj,
            tmp / "resume-300",
            scratch=tmp / ".resume-300.download",
            data_key=key,
            counter=counter,
            connections=connections,
        )
    if stats.connections != connections:
        raise AssertionError(f"the new path used {stats.connections} connection(s)")
    return stats.download_s, stats.total_s - stats.download_s, counter.down


def report(kind: str, size: int, runs: dict[str, list[tuple[float, float, int]]]) -> None:
    def median(path: str, phase: int) -> float:
        return statistics.median(run[phase] for run in runs[path])

    for figure, phase in (("download", 0), ("unpack after the last byte", 1)):
        old, new = median("old", phase), median("new", phase)
        print(
            line(f"{kind} restore: {figure}", f"{new:6.2f} s", f"sequential {old:.2f} s", new / old)
        )
    old = statistics.median(run[0] + run[1] for run in runs["old"])
    new = statistics.median(run[0] + run[1] for run in runs["new"])
    verdict = "meets" if new / old <= GOAL else "misses"
    print(
        line(
            f"{kind} restore: total ({verdict} goal <= {GOAL})",
            f"{new:6.2f} s {size / 1e6 / new:5.1f} MB/s",
            f"sequential {old:.2f} s {size / 1e6 / old:.1f} MB/s",
            new / old,
        )
    )


def main() -> int:
    args = parse_args()
    if args.serve:
        serve(args)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-restore-bench-"))
    server = None
    try:
        objects, work = tmp / "objects", tmp / "work"
        objects.mkdir()
        work.mkdir()
        hashes = make_checkpoint(tmp / "checkpoint-300", args.mb)
        key = os.urandom(32)
        from agent import checkpoints as ck

        made = {}
        for kind in args.kinds:
            crypt = ck.new_crypt(key) if kind == "encrypted" else None
            made[kind] = write_object(tmp / "checkpoint-300", objects / f"{kind}.obj", crypt)
        shutil.rmtree(tmp / "checkpoint-300")
        server, url = start_server(args, objects)
        print(
            f"restore bench: checkpoint {args.mb} MB, link {args.link_mbit:g} Mbit/s, one TCP "
            f"stream {args.stream_mbit:g} Mbit/s, {args.ttfb_ms:g} ms to first byte, new path "
            f"{args.connections} connections, median of {args.repeats}"
        )
        for kind, info in made.items():
            obj = {"url": f"{url}/{info['name']}?X-Amz-Signature=bench", **info}
            data_key = key if kind == "encrypted" else None
            runs: dict[str, list[tuple[float, float, int]]] = {"old": [], "new": []}
            for _ in range(args.repeats):
                for path in ("old", "new"):
                    if path == "old":
                        result = run_old(work, obj, data_key)
                    else:
                        result = run_new(work, obj, data_key, args.connections)
                    if result[2] != info["size"]:
                        raise AssertionError(f"{path}: counted {result[2]} bytes down")
                    check_restored(work / "resume-300", hashes)
                    shutil.rmtree(work / "resume-300")
                    runs[path].append(result)
            report(kind, info["size"], runs)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
