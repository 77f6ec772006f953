"""Benchmark: the provider start-up of a rental on a machine that already pulled the image,
against the same machine's first rental (the pull), on the sandbox over HTTP.

Usage: ``python bench/image_cache.py [--quick] [--offers N] [--time-scale S]``.
Default: the N=8 single RTX 4090 offers of the bundled market with 500-2,000 Mbit/s down
(the issue's hosts), each rented twice in a row with the same image (``pytorch/pytorch``,
3.6 GB in the sandbox's table, about the field report's 4 GB), at time scale 0.05, no wipe.
Each rental's ``created`` to ``running`` is read from the sandbox's own event log and divided
by the scale: production seconds. Printed: the medians of the first rental (scheduling, the
pull, the container start) and of the second (scheduling, the container start), their ratio,
and the expected saving when hosts wipe the image at the sandbox's guessed chance (0.2).
About 20 s (at 0.01 the ticker's 20 ms read as 2 s of production time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402
from sandbox.image_cache import GUESSED_WIPE_CHANCE  # noqa: E402

KEY = "bench-key"
IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"


def start_sandbox(state: Path, scale: float) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "sandbox", "serve", "--port", "0"]
    args += ["--state-dir", str(state), "--api-key", KEY, "--relaxed-rate-limits"]
    args += ["--time-scale", str(scale), "--image-wipe-chance", "0"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            return proc, json.loads((state / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the sandbox did not start")


def field_report_asks(client: httpx.Client, count: int) -> list[dict]:
    query = {
        "gpu_name": {"eq": "RTX 4090"},
        "num_gpus": {"eq": 1},
        "inet_down": {"gte": 500, "lte": 2000},
        "rentable": {"eq": True},
        "order": [["inet_down", "asc"]],
        "limit": 1000,
    }
    offers = client.post("/api/v0/bundles/", json=query).raise_for_status().json()["offers"]
    step = max(len(offers) // count, 1)
    return offers[::step][:count]


def rent_once(client: httpx.Client, ask: int, scale: float) -> tuple[float, str]:
    """Rent ASK, wait for running, destroy; (created to running in production s, source)."""
    created = client.put(f"/api/v0/asks/{ask}/", json={"image": IMAGE, "disk": 20}).json()
    iid = created["new_contract"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = client.get(f"/sandbox/instances/{iid}").json()
        if view["status"] == "running":
            break
        time.sleep(0.02)
    else:
        raise SystemExit(f"instance {iid} never ran")
    client.delete(f"/api/v0/instances/{iid}/").raise_for_status()
    at = {e["kind"]: e["ts"] for e in view["events"]}
    return (at["running"] - at["created"]) / scale, view["image_source"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="4 offers instead of N")
    args = parser.parse_args()
    if args.quick:
        args.offers = min(args.offers, 4)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_sandbox(Path(tmp) / "state", args.time_scale)
        headers = {"Authorization": f"Bearer {KEY}"}
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=30, trust_env=False) as c:
                rows = []
                for offer in field_report_asks(c, args.offers):
                    first, source1 = rent_once(c, offer["id"], args.time_scale)
                    second, source2 = rent_once(c, offer["id"], args.time_scale)
                    assert (source1, source2) == ("pulled", "machine"), (source1, source2)
                    rows.append((offer["inet_down"], first, second))
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    for mbps, first, second in rows:
        print(f"  {mbps:7.0f} Mbit/s: first rental {first:6.1f} s, image cached {second:5.1f} s")
    pulled = statistics.median(r[1] for r in rows)
    cached = statistics.median(r[2] for r in rows)
    kept = 1 - GUESSED_WIPE_CHANCE
    expected = kept * cached + (1 - kept) * pulled
    print(
        line(
            "created→running, image cached (median)",
            f"{cached:.1f} s",
            f"the machine's first rental {pulled:.1f} s",
            cached / pulled,
        )
    )
    print(
        line(
            f"expected, {GUESSED_WIPE_CHANCE:.0%} of hosts wiped it",
            f"{expected:.1f} s",
            f"the machine's first rental {pulled:.1f} s",
            expected / pulled,
        )
    )


if __name__ == "__main__":
    main()
