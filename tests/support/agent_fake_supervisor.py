"""A live stand-in for the supervisor's agent API (agent/PROTOCOL.md), for the agent's tests.

Standard-library HTTP server with one in-memory job; checkpoints go to a real S3 protocol server
(moto) through presigned URLs, created and completed the way the Django side will do it. It
validates payloads about as strictly as the real schemas should, so a drift in the agent's
wire format fails here first. A job's code comes as a code pack in the same storage
(``store_code_pack``, as the member API stores one) or as a git commit (``use_git``; tests make
a bare repository with ``git_repository`` and serve it over file://).

Over 500 lines on purpose: ``FakeSupervisor`` is the protocol's whole supervisor side in one
class, the working reference agent/PROTOCOL.md points to.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent import procs
from tests.support.processes import wait_until
from tests.support.s3 import free_port

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy" / "train.py"
TAIL_LIMIT = 8 * 1024
PHASES = {"restoring", "running", "uploading", "exiting"}
REASONS = {"finished", "failed", "stopped", "killed", "agent_error", "setup_failed"}


class FakeS3:
    """moto's S3 server on a free port, one bucket, and boto3 to presign and inspect."""

    def __init__(self) -> None:
        import boto3
        from botocore.config import Config
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.bucket = "nomad-ckpt"
        self.client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            config=Config(
                signature_version="s3v4",
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self.client.create_bucket(Bucket=self.bucket)

    def presign(self, method: str, **params: Any) -> str:
        return self.client.generate_presigned_url(
            method, Params={"Bucket": self.bucket, **params}, ExpiresIn=600
        )

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> list[str]:
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for item in listing.get("Contents", []))

    def close(self) -> None:
        self.server.stop()


@dataclass
class FakeJob:
    command: str
    env: dict[str, str] = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}")
    team: str = "team-a"
    data_key: bytes | None = None
    total_steps: int | None = None
    heartbeat_interval_s: float = 0.2
    part_size: int = 8 * 1024 * 1024
    keep_last: int = 3
    stop_grace_s: float | None = None
    checkpoint_mode: str | None = None  # None: left out of register's reply, as older servers do
    setup: str = ""
    secrets: dict[str, str] = field(default_factory=dict)
    # The job's code: None, or what store_code_pack / use_git record (register presigns it).
    workdir: dict[str, Any] | None = None
    # Several GPUs (PROTOCOL.md "Launchers"); None: left out, as older servers do.
    launcher: str | None = None
    num_gpus: int | None = None


@dataclass
class Attempt:
    no: int
    token: str
    live: bool = True
    registered: dict[str, Any] | None = None
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    commands: list[str] = field(default_factory=list)
    dead_for: set[str] = field(default_factory=set)  # endpoints that answer 410


@dataclass
class Checkpoint:
    id: str
    attempt: int
    step: int
    key: str
    size: int
    encrypted: bool
    upload_id: str | None = None
    sha256: str | None = None
    ready: bool = False


class ApiError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def toy_command() -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(TOY))}"


class FakeSupervisor:
    def __init__(self, s3: FakeS3, job: FakeJob) -> None:
        self.s3 = s3
        self.job = job
        self.lock = threading.Lock()
        self.attempts: dict[int, Attempt] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.calls: list[tuple[float, int | None, str, int]] = []  # (time, attempt, name, status)
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.resume()

    # --- control from tests -----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def new_attempt(self) -> Attempt:
        with self.lock:
            for attempt in self.attempts.values():
                attempt.live = False  # a new attempt fences the old ones
            attempt = Attempt(no=len(self.attempts) + 1, token=uuid.uuid4().hex)
            self.attempts[attempt.no] = attempt
            return attempt

    def fence(self, attempt: Attempt, *, only: str | None = None) -> float:
        """Kill ATTEMPT's token (for the endpoint ONLY, when given); returns the moment."""
        with self.lock:
            if only:
                attempt.dead_for.add(only)
            else:
                attempt.live = False
            return time.time()

    def command(self, attempt: Attempt, command: str) -> None:
        with self.lock:
            attempt.commands.append(command)

    def pause(self) -> None:
        """Stop listening: the agent's connections are refused until resume()."""
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def resume(self) -> None:
        handler = type("Handler", (_Handler,), {"supervisor": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.pause()

    def ready_checkpoints(self, attempt: Attempt | None = None) -> list[Checkpoint]:
        with self.lock:
            found = [c for c in self.checkpoints.values() if c.ready]
        if attempt is not None:
            found = [c for c in found if c.attempt == attempt.no]
        return sorted(found, key=lambda c: (c.attempt, c.step))

    def calls_of(self, name: str) -> list[tuple[float, int | None, str, int]]:
        with self.lock:
            return [c for c in self.calls if c[2] == name]

    def prefix(self, attempt_no: int) -> str:
        return f"teams/{self.job.team}/jobs/{self.job.id}/attempts/{attempt_no}/checkpoints/"

    def store_code_pack(self, pack: bytes, *, encrypted: bool = False) -> str:
        """Store PACK (a .tar.gz) as the team's code pack, ngck1-encrypted with a key of its
        own when ENCRYPTED (as the server does for a job that encrypts checkpoints), and make
        it the job's code; returns the storage key."""
        from agent.ckptcrypto import encrypt_stream

        data_key = os.urandom(32) if encrypted else None
        key = f"teams/{self.job.team}/workdirs/{hashlib.sha256(pack).hexdigest()}.tar.gz"
        stored = pack
        if data_key is not None:
            key += ".ngck1"
            out = io.BytesIO()
            encrypt_stream(io.BytesIO(pack), out, data_key)
            stored = out.getvalue()
        self.s3.client.put_object(Bucket=self.s3.bucket, Key=key, Body=stored)
        self.job.workdir = {
            "kind": "archive", "key": key, "size": len(stored),
            "sha256": hashlib.sha256(stored).hexdigest(), "data_key": data_key,
        }  # fmt: skip
        return key

    def use_git(self, url: str, commit: str, *, ssh_key: str | None = None) -> None:
        """Make the job's code COMMIT of the repository at URL (already resolved, as at submit)."""
        self.job.workdir = {"kind": "git", "url": url, "commit": commit, "ssh_key": ssh_key}

    # --- the API ----------------------------------------------------------------------------

    def dispatch(self, token: str | None, name: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """One API call, recorded in self.calls; the lock orders it against fence() & co."""
        with self.lock:
            attempt = next((a for a in self.attempts.values() if a.token == token), None)
            try:
                status, reply = 200, self._handle(attempt, name, raw)
            except ApiError as exc:
                status, reply = exc.status, {"detail": exc.detail}
            self.calls.append((time.time(), attempt.no if attempt else None, name, status))
            return status, reply

    def _handle(self, attempt: Attempt | None, name: str, raw: bytes) -> dict[str, Any]:
        if attempt is None:
            raise ApiError(401, "unknown agent token")
        if not attempt.live or name in attempt.dead_for:
            raise ApiError(410, "this attempt has ended")
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise ApiError(422, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        if name == "register":
            return self._register(attempt, body)
        if name == "heartbeat":
            return self._heartbeat(attempt, body)
        if name == "checkpoints":
            return self._new_checkpoint(attempt, body)
        match = re.fullmatch(r"checkpoints/([\w-]+)/complete", name)
        if match:
            return self._complete(attempt, match.group(1), body)
        if name == "exit":
            return self._exit(attempt, body)
        raise ApiError(404, f"no endpoint {name}")

    def _register(self, attempt: Attempt, body: dict[str, Any]) -> dict[str, Any]:
        _check(body, agent_version=str, hostname=str, python=str)
        attempt.registered = body
        job = self.job
        return {
            "job_id": job.id,
            "attempt_no": attempt.no,
            "command": job.command,
            **({"launcher": job.launcher} if job.launcher else {}),
            **({"num_gpus": job.num_gpus} if job.num_gpus is not None else {}),
            "env": job.env,
            "heartbeat_interval_s": job.heartbeat_interval_s,
            "total_steps": job.total_steps,
            "stop_grace_s": job.stop_grace_s,
            "checkpoint": {
                "keep_last": job.keep_last,
                "upload_part_size": job.part_size,
                **({"mode": job.checkpoint_mode} if job.checkpoint_mode else {}),
            },
            "resume": self._resume_target(),
            **({"num_gpus": job.num_gpus} if job.num_gpus else {}),
            "setup": job.setup,
            "secrets": job.secrets,
            "workdir": self._workdir_reply(),
            "encryption": (
                {"data_key_b64": base64.b64encode(job.data_key).decode(), "format": "ngck1"}
                if job.data_key
                else None
            ),
        }

    def _workdir_reply(self) -> dict[str, Any] | None:
        code = self.job.workdir
        if code is None:
            return None
        if code["kind"] == "git":
            return {k: code[k] for k in ("kind", "url", "commit", "ssh_key")}
        key = code["data_key"]
        return {
            "kind": "archive",
            "object": {
                "url": self.s3.presign("get_object", Key=code["key"]),
                "size": code["size"],
                "sha256": code["sha256"],
            },
            "encrypted": key is not None,
            "data_key_b64": base64.b64encode(key).decode() if key else None,
        }

    def _resume_target(self) -> dict[str, Any] | None:
        ready = [c for c in self.checkpoints.values() if c.ready]
        if not ready:
            return None
        newest = max(ready, key=lambda c: (c.step, c.attempt))
        return {
            "checkpoint_id": newest.id,
            "step": newest.step,
            "encrypted": newest.encrypted,
            "object": {
                "url": self.s3.presign("get_object", Key=newest.key),
                "size": newest.size,
                "sha256": newest.sha256,
            },
        }

    def _heartbeat(self, attempt: Attempt, body: dict[str, Any]) -> dict[str, Any]:
        _check(body, seq=int, phase=str, bytes_down=int, bytes_up=int, log_tail=str, gpu=dict)
        last = max((h["seq"] for h in attempt.heartbeats), default=0)
        if body["seq"] <= last:
            raise ApiError(409, f"seq {body['seq']} is not after {last}")
        if body["phase"] not in PHASES:
            raise ApiError(422, f"unknown phase {body['phase']!r}")
        if len(body["log_tail"].encode()) > TAIL_LIMIT:
            raise ApiError(422, "log_tail is over 8 KiB")
        if not isinstance(body["gpu"].get("ok"), bool):
            raise ApiError(422, "gpu must be {ok, error}")
        for name in ("step", "total_steps"):
            if body.get(name) is not None and not isinstance(body[name], int):
                raise ApiError(422, f"{name} must be an integer or null")
        _check_phase_progress(body.get("phase_progress"))
        attempt.heartbeats.append({**body, "received_at": time.time()})
        command = attempt.commands.pop(0) if attempt.commands else "continue"
        return {"command": command, "heartbeat_interval_s": self.job.heartbeat_interval_s}

    def _new_checkpoint(self, attempt: Attempt, body: dict[str, Any]) -> dict[str, Any]:
        _check(body, step=int, size=int, encrypted=bool)
        if body["encrypted"] != (self.job.data_key is not None):
            raise ApiError(409, "encrypted does not match the job's encryption setting")
        existing = next(
            (
                c
                for c in self.checkpoints.values()
                if (c.attempt, c.step) == (attempt.no, body["step"])
            ),
            None,
        )
        if existing and existing.ready:
            raise ApiError(409, f"checkpoint for step {body['step']} is already complete")
        name = "checkpoint.tar.ngck" if body["encrypted"] else "checkpoint.tar"
        key = f"{self.prefix(attempt.no)}{body['step']}/{name}"
        ckpt = existing or Checkpoint(
            id=uuid.uuid4().hex[:12], attempt=attempt.no, step=body["step"], key=key,
            size=body["size"], encrypted=body["encrypted"],
        )  # fmt: skip
        ckpt.size = body["size"]
        self.checkpoints[ckpt.id] = ckpt
        if body["size"] <= self.job.part_size:
            ckpt.upload_id = None
            url = self.s3.presign("put_object", Key=key)
            return {
                "checkpoint_id": ckpt.id,
                "upload": {"kind": "single", "url": url, "headers": {}},
            }
        upload_id = self.s3.client.create_multipart_upload(Bucket=self.s3.bucket, Key=key)[
            "UploadId"
        ]
        ckpt.upload_id = upload_id
        count = -(-body["size"] // self.job.part_size)
        parts = [
            {
                "part_number": n,
                "url": self.s3.presign("upload_part", Key=key, UploadId=upload_id, PartNumber=n),
            }
            for n in range(1, count + 1)
        ]
        upload = {"kind": "multipart", "part_size": self.job.part_size, "parts": parts}
        return {"checkpoint_id": ckpt.id, "upload": upload}

    def _complete(self, attempt: Attempt, ckpt_id: str, body: dict[str, Any]) -> dict[str, Any]:
        _check(body, size=int, sha256=str)
        ckpt = self.checkpoints.get(ckpt_id)
        if ckpt is None or ckpt.attempt != attempt.no:
            raise ApiError(404, "no such checkpoint for this attempt")
        if ckpt.ready:
            if body["sha256"] == ckpt.sha256:
                return {"ready": True, "step": ckpt.step}
            raise ApiError(409, "already complete with another sha256")
        if ckpt.upload_id:
            parts = body.get("parts")
            if not isinstance(parts, list):
                raise ApiError(422, "multipart uploads need parts")
            listed = [{"PartNumber": p["part_number"], "ETag": p["etag"]} for p in parts]
            self.s3.client.complete_multipart_upload(
                Bucket=self.s3.bucket,
                Key=ckpt.key,
                UploadId=ckpt.upload_id,
                MultipartUpload={"Parts": listed},
            )
        data = self.s3.get(ckpt.key)
        if len(data) != body["size"] or len(data) != ckpt.size:
            raise ApiError(422, f"stored object has {len(data)} bytes, not {body['size']}")
        if hashlib.sha256(data).hexdigest() != body["sha256"]:
            raise ApiError(422, "stored object's sha256 differs from the reported one")
        ckpt.sha256 = body["sha256"]
        manifest = {
            "format_version": 1, "job": self.job.id, "attempt": attempt.no, "step": ckpt.step,
            "object": ckpt.key.rsplit("/", 1)[1], "size": ckpt.size, "sha256": ckpt.sha256,
            "encrypted": ckpt.encrypted, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }  # fmt: skip
        self.s3.client.put_object(
            Bucket=self.s3.bucket, Key=ckpt.key.rsplit("/", 1)[0] + "/manifest.json",
            Body=json.dumps(manifest).encode(), IfNoneMatch="*",
        )  # fmt: skip
        ckpt.ready = True
        return {"ready": True, "step": ckpt.step}

    def _exit(self, attempt: Attempt, body: dict[str, Any]) -> dict[str, Any]:
        _check(body, reason=str, log_tail=str)
        for name in ("exit_code", "signal"):
            if body.get(name) is not None and not isinstance(body[name], int):
                raise ApiError(422, f"{name} must be an integer or null")
        if body["reason"] not in REASONS:
            raise ApiError(422, f"unknown reason {body['reason']!r}")
        attempt.exit = {**body, "received_at": time.time()}
        attempt.live = False
        return {}


def _check_phase_progress(progress: Any) -> None:
    """PROTOCOL.md, heartbeat ``phase_progress``: optional; per phase begun, bytes done (a
    whole number ≥ 0), bytes total (one, or null when unknown) and whether it ended."""
    if progress is None:
        return
    if not isinstance(progress, dict):
        raise ApiError(422, "phase_progress must be an object")
    for name, phase in progress.items():
        if not isinstance(phase, dict):
            raise ApiError(422, f"phase_progress.{name} must be an object")
        done, total = phase.get("bytes_done"), phase.get("bytes_total")
        if not _count(done) or (total is not None and not _count(total)):
            raise ApiError(422, f"phase_progress.{name}: bytes must be whole numbers >= 0")
        if not isinstance(phase.get("done"), bool):
            raise ApiError(422, f"phase_progress.{name}.done must be true or false")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _check(body: dict[str, Any], **types: type) -> None:
    for name, kind in types.items():
        value = body.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ApiError(422, f"{name} must be {kind.__name__}")


class _Handler(BaseHTTPRequestHandler):
    supervisor: FakeSupervisor

    def do_POST(self) -> None:
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, reply = self.supervisor.dispatch(token, self.path.removeprefix("/api/agent/"), raw)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class AgentRun:
    proc: subprocess.Popen
    workdir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"agent still running after {timeout}s:\n{self.log()[-3000:]}"
            ) from None

    def stop(self) -> None:
        """Kill whatever is left: the agent's group and the command's (its own session), and
        the sessions of a launcher's ranks (all the agent's descendants: the host is gone)."""
        groups = [self.proc.pid]
        started = re.findall(r"started [^\n]*?\(pid (\d+)\)", self.log())  # git, setup, command
        groups += [int(pid) for pid in started]
        groups += sorted(procs.other_groups(procs.descendants(self.proc.pid), exclude=groups))
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()

    def child_pid(self) -> int:
        match = wait_until(
            lambda: re.search(r"started command \(pid (\d+)\)", self.log()),
            timeout=20,
            what="the agent to start the command",
        )
        return int(match.group(1))


def start_agent(
    supervisor: FakeSupervisor,
    attempt: Attempt,
    workdir: Path,
    *,
    zipapp: Path | None = None,
    env: dict[str, str] | None = None,
) -> AgentRun:
    """The real agent as a subprocess (`python -m agent`, or the zipapp) in its own session."""
    workdir.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "NOMAD_SUPERVISOR_URL": supervisor.url,
        "NOMAD_AGENT_TOKEN": attempt.token,
        "NOMAD_WORKDIR": str(workdir),
        "NOMAD_STOP_GRACE_S": "10",
        "NOMAD_NVIDIA_SMI": "nomad-test-no-such-nvidia-smi",
        **(env or {}),
    }
    full_env.pop("NOMAD_CHECKPOINT_DIR", None)
    if zipapp is not None:
        full_env.pop("PYTHONPATH")
    args = [sys.executable, str(zipapp)] if zipapp else [sys.executable, "-m", "agent"]
    log_path = workdir / f"agent-{attempt.no}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            args, cwd=workdir, env=full_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return AgentRun(proc, workdir, log_path)


def code_pack(files: dict[str, bytes | str], *, modes: dict[str, int] | None = None) -> bytes:
    """A .tar.gz of FILES (name -> content) the way the CLI packs a folder: sorted, mtime 0,
    owner 0, no owner names; MODES gives a file's permission bits (default 0644)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name in sorted(files):
            data = files[name].encode() if isinstance(files[name], str) else files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), (modes or {}).get(name, 0o644), 0
            tar.addfile(info, io.BytesIO(data))  # type: ignore[arg-type]
    return out.getvalue()


def git_repository(path: Path, commits: list[dict[str, str]]) -> tuple[str, list[str]]:
    """A bare repository at PATH whose branch ``main`` has one commit per dict of COMMITS
    (file name -> content, on top of the one before), made with the git CLI; returns its
    file:// URL and the commits' ids, oldest first."""
    work = path.with_name(path.name + ".src")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip

    def git(*args: str, cwd: Path = work) -> str:
        done = subprocess.run(
            ["git", "-c", "init.defaultBranch=main", *args],
            cwd=cwd, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.strip()

    path.mkdir(parents=True)
    work.mkdir()
    git("init", "-q", "--bare", str(path), cwd=path)
    git("init", "-q")
    ids = []
    for files in commits:
        for name, content in files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(content)
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {len(ids) + 1}")
        ids.append(git("rev-parse", "HEAD"))
    git("push", "-q", str(path), "HEAD:refs/heads/main")
    return path.as_uri(), ids
