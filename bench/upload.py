"""Benchmark: encrypted checkpoint upload and restore vs plain boto3 transfers of the same bytes.

Usage: ``python bench/upload.py [--quick] [--mb N] [--repeats R]`` (about a minute for the
default 256 MB; ``--quick`` 64 MB, one repeat).

A moto S3 server (its own process, like the test suite's ``moto_server_url`` but out of this
process's GIL) and a checkpoint folder of N MB (a few large files of random bytes, like
adapter weights and optimizer state, and small JSON files) are made in a temporary folder.

- agent upload: the agent's own path (``agent.checkpoints``): plan the tar, pack it through
  ngck1 encryption, hash it once, and PUT it to presigned part URLs; the supervisor's part
  (``nomadgpu.storage.S3ObjectStore``: create the multipart upload, presign, complete) is timed
  too, as it is part of the wait.
- agent restore: presigned GET with size and sha256 check, then decrypt and unpack.
- baseline: ``boto3`` ``upload_file`` / ``download_file`` (default transfer settings) of the same
  bytes (the encrypted object) to and from the same server.

Every restore is checked byte for byte against the original folder. Printed: MB/s of each
direction, agent vs baseline (ratio = agent throughput / baseline throughput; goal 0.8), the
median of R runs of each.
"""

from __future__ import annotations

import argparse
import base64
import filecmp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line  # noqa: E402

GOAL = 0.8
BUCKET = "bench-ckpt"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MB, one run")
    parser.add_argument("--mb", type=int, help="checkpoint size in MB (default 256; quick 64)")
    parser.add_argument("--repeats", type=int, help="runs of each (default 3; quick 1)")
    args = parser.parse_args()
    args.mb = args.mb or (64 if args.quick else 256)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(tmp: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    log = (tmp / "moto.log").open("wb")
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/moto-api/", timeout=1)
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited; see {tmp / 'moto.log'}") from None
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def make_checkpoint(folder: Path, mb: int) -> None:
    """MB megabytes: half optimizer state, the rest adapter shards, plus small JSON files."""
    folder.mkdir(parents=True)
    sizes = {"optimizer.pt": mb // 2, "adapter_model-1.safetensors": mb - mb // 2 - mb // 4}
    sizes["adapter_model-2.safetensors"] = mb // 4
    for name, size in sizes.items():
        with (folder / name).open("wb") as out:
            for _ in range(size):
                out.write(os.urandom(1024 * 1024))
    (folder / "trainer_state.json").write_text('{"global_step": 300}\n' * 50)
    (folder / "adapter_config.json").write_text('{"r": 16, "lora_alpha": 32}\n')


def configure(tmp: Path) -> None:
    """Django settings only for the supervisor's constants (part size); no database is used."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="nomadgpu.settings",
        NOMADGPU_VAR_DIR=str(tmp / "var"),
        FIELD_ENCRYPTION_KEY=base64.b64encode(os.urandom(32)).decode(),
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()


class Bench:
    def __init__(self, tmp: Path, url: str, folder: Path) -> None:
        import boto3
        import httpx

        from nomadgpu.storage import S3ObjectStore

        self.tmp, self.folder = tmp, folder
        self.store = S3ObjectStore(
            bucket=BUCKET,
            endpoint_url=url,
            access_key_id="testing",
            secret_access_key="testing",
            region="us-east-1",
        )
        self.store.client.create_bucket(Bucket=BUCKET)
        self.plain = boto3.client("s3", endpoint_url=url, region_name="us-east-1", **CREDENTIALS)
        # The agent's storage client, as agent/state.py makes it.
        self.http = httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0))
        self.data_key = os.urandom(32)

    def agent_upload(self, key: str) -> tuple[float, int, str]:
        """(seconds, object size, sha256) of one encrypted upload through the agent's code."""
        from agent import checkpoints as ck
        from jobs.checkpoints.records import PART_SIZE, SINGLE_PUT_LIMIT, parts_needed

        t0 = time.perf_counter()
        plan = ck.plan_tar(self.folder)
        crypt = ck.new_crypt(self.data_key)
        size = ck.object_size(plan, True)
        # The supervisor's side of POST /checkpoints (jobs.checkpoints.records.plan_upload).
        if size > SINGLE_PUT_LIMIT:
            upload_id = self.store.create_multipart(key)
            parts = [
                {"part_number": n, "url": self.store.presign_part(key, upload_id, n)}
                for n in range(1, parts_needed(size, PART_SIZE) + 1)
            ]
            target = {"kind": "multipart", "part_size": PART_SIZE, "parts": parts}
        else:
            upload_id, target = "", {"kind": "single", "url": self.store.presign_put(key)}
        done = ck.upload_object(
            self.http,
            target,
            size,
            lambda: ck.object_pieces(plan, crypt),
            cancel=threading.Event(),
            counter=ck.ByteCounter(),
        )
        if upload_id:  # the supervisor's side of POST .../complete
            parts = [(p["part_number"], p["etag"]) for p in done.parts or []]
            self.store.complete_multipart(key, upload_id, parts)
        return time.perf_counter() - t0, size, done.sha256

    def agent_restore(self, key: str, size: int, sha256: str) -> float:
        from agent import checkpoints as ck

        archive, target = self.tmp / "restore.ngck", self.tmp / "restored"
        t0 = time.perf_counter()
        obj = {"url": self.store.presign_get(key), "size": size, "sha256": sha256}
        ck.download_verified(self.http, obj, archive, counter=ck.ByteCounter())
        ck.unpack(archive, target, data_key=self.data_key)
        spent = time.perf_counter() - t0
        same_as_original(self.folder, target)
        archive.unlink()
        shutil.rmtree(target)
        return spent

    def plain_upload(self, source: Path, key: str) -> float:
        t0 = time.perf_counter()
        self.plain.upload_file(str(source), BUCKET, key)
        return time.perf_counter() - t0

    def plain_download(self, key: str) -> float:
        dest = self.tmp / "plain.bin"
        t0 = time.perf_counter()
        self.plain.download_file(BUCKET, key, str(dest))
        spent = time.perf_counter() - t0
        dest.unlink()
        return spent

    def save_object(self, key: str, dest: Path) -> None:
        self.plain.download_file(BUCKET, key, str(dest))

    def delete(self, *keys: str) -> None:
        self.store.delete_keys(list(keys))


def same_as_original(original: Path, restored: Path) -> None:
    names = sorted(p.name for p in original.iterdir())
    if sorted(p.name for p in restored.iterdir()) != names:
        raise AssertionError("the restored checkpoint has other files than the original")
    _, mismatch, errors = filecmp.cmpfiles(original, restored, names, shallow=False)
    if mismatch or errors:
        raise AssertionError(f"restored files differ from the original: {mismatch + errors}")


def report(mb: int, runs: dict[str, list[float]], size: int, repeats: int) -> None:
    obj_mb = size / 1024**2

    def rate(name: str) -> float:
        return obj_mb / statistics.median(runs[name])

    print(
        f"upload bench: checkpoint {mb} MB, ngck1 object {obj_mb:.1f} MB, moto S3 server, "
        f"median of {repeats}"
    )
    for direction, agent, plain, call in (
        ("upload", "agent_up", "plain_up", "upload_file"),
        ("restore", "agent_down", "plain_down", "download_file"),
    ):
        print(
            line(
                f"encrypted checkpoint {direction}",
                f"{rate(agent):7.1f} MB/s",
                f"boto3 {call} {rate(plain):.1f} MB/s",
                rate(agent) / rate(plain),
            )
        )


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-upload-bench-"))
    moto = None
    try:
        configure(tmp)
        moto, url = start_moto(tmp)
        folder = tmp / "checkpoint-300"
        make_checkpoint(folder, args.mb)
        bench = Bench(tmp, url, folder)
        bench.agent_upload("warm")  # imports, connections, the server's first bucket writes
        bench.delete("warm")
        runs: dict[str, list[float]] = {k: [] for k in ("agent_up", "plain_up", "agent_down")}
        runs["plain_down"] = []
        for i in range(args.repeats):
            key = f"teams/bench/jobs/1/attempts/1/checkpoints/{i}/checkpoint.tar.ngck"
            spent, size, sha = bench.agent_upload(key)
            runs["agent_up"].append(spent)
            runs["agent_down"].append(bench.agent_restore(key, size, sha))
            same_bytes = tmp / "object.ngck"
            bench.save_object(key, same_bytes)
            runs["plain_up"].append(bench.plain_upload(same_bytes, f"plain/{i}"))
            runs["plain_down"].append(bench.plain_download(f"plain/{i}"))
            same_bytes.unlink()
            bench.delete(key, f"plain/{i}")
        report(args.mb, runs, size, args.repeats)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
