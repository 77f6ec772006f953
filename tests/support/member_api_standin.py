"""A stand-in for the member API's code-pack endpoints and a presigned storage target.

It follows issue 28's contract (``POST /api/workdirs``, ``PUT /api/workdirs/<sha>/content``,
``POST /api/workdirs/<sha>/complete``, ``POST /api/jobs/``) over real HTTP on loopback, so the
CLI's uploads are tested byte for byte while the server's endpoints are written. Its storage
behaves as S3 does with a presigned PUT: the signature in the URL is the permission, a request
that also carries an ``Authorization`` header is refused, and so is one without a length.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MB = 1024 * 1024
SIGNING_KEY = b"stand-in storage key"


@dataclass
class Seen:
    """One request as it arrived (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int
    body: dict | None = None


@dataclass
class PackRow:
    team: str
    sha256: str
    size: int
    encrypted: bool
    state: str = "uploading"

    @property
    def key(self) -> str:
        suffix = ".ngck1" if self.encrypted else ""
        return f"teams/{self.team}/workdirs/{self.sha256}.tar.gz{suffix}"


@dataclass
class StandIn:
    """The server side: what it was sent (``seen``), stored (``objects``) and submitted."""

    token: str
    team: str = "team-a"  # the member's only team: what ``"team": null`` means
    max_bytes: int = 200 * MB
    seen: list[Seen] = field(default_factory=list)
    objects: dict[str, bytes] = field(default_factory=dict)
    # One row per (team, sha256, encrypted), as jobs.models.WorkdirPack's unique constraint.
    packs: dict[tuple[str, str, bool], PackRow] = field(default_factory=dict)
    jobs: list[dict] = field(default_factory=list)
    corrupt_next_storage_put: bool = False
    url: str = ""

    def requests_to(self, prefix: str, method: str | None = None) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith(prefix) and method in (None, s.method)]

    # ---- routing ------------------------------------------------------------------------------

    def handle(self, seen: Seen) -> Reply:
        self.seen.append(seen)
        path = urlsplit(seen.path).path
        if path.startswith("/storage/"):
            return self.storage_put(seen)
        if seen.headers.get("authorization") != f"Bearer {self.token}":
            return Reply(401, {"detail": "Unauthorized"})
        body = json.loads(seen.body) if seen.method == "POST" else None
        if (seen.method, path) == ("POST", "/api/workdirs"):
            return self.offer(body)
        if (seen.method, path) == ("POST", "/api/jobs/"):
            return self.submit(body)
        if match := re.fullmatch(r"/api/workdirs/([0-9a-f]{64})/complete", path):
            return self.complete(match[1], body) if seen.method == "POST" else Reply(405)
        if match := re.fullmatch(r"/api/workdirs/([0-9a-f]{64})/content", path):
            return self.content(match[1], seen) if seen.method == "PUT" else Reply(405)
        return Reply(404, {"detail": "Not Found"})

    # ---- the member API -----------------------------------------------------------------------

    def offer(self, body: dict) -> Reply:
        team = body["team"] or self.team
        if body["size"] > self.max_bytes:
            return Reply(413, {"detail": self.too_big(body["size"])})
        key = (team, body["sha256"], body["encrypted"])
        row = self.packs.setdefault(key, PackRow(*key[:2], body["size"], body["encrypted"]))
        if row.state == "ready":
            return Reply(200, {"sha256": row.sha256, "state": "ready"})
        if row.encrypted:
            upload = {"method": "PUT", "url": f"/api/workdirs/{row.sha256}/content", "via": "api"}
        else:
            upload = {"method": "PUT", "url": self.presign(row.key), "via": "storage"}
        return Reply(200, {"sha256": row.sha256, "state": "uploading", "upload": upload})

    def too_big(self, size: int) -> str:
        return (
            f"the code pack is {size / MB:.1f} MB; the limit is {self.max_bytes / MB:g} MB "
            "(WORKDIR_MAX_MB)"
        )

    def content(self, sha256: str, seen: Seen) -> Reply:
        """The encrypted route: the server receives the plaintext and stores it sealed."""
        row = self.packs.get((self.team, sha256, True))  # the URL names no team
        if row is None:
            return Reply(404, {"detail": "no encrypted pack is being uploaded with that sha256"})
        if hashlib.sha256(seen.body).hexdigest() != sha256 or len(seen.body) != row.size:
            return Reply(409, {"detail": "the uploaded pack does not match its sha256 and size"})
        self.objects[row.key] = b"ngck1" + seen.body[::-1]  # sealed, in a stand-in's way
        row.state = "ready"
        return Reply(200, {"sha256": sha256, "state": "ready"})

    def complete(self, sha256: str, body: dict) -> Reply:
        row = self.packs.get((body["team"] or self.team, sha256, body["encrypted"]))
        if row is None:
            return Reply(404, {"detail": "no such code pack"})
        stored = self.objects.get(row.key)
        if (
            stored is None
            or len(stored) != row.size
            or hashlib.sha256(stored).hexdigest() != sha256
        ):
            return Reply(409, {"detail": "the stored code pack does not match its sha256 and size"})
        row.state = "ready"
        return Reply(200, {"sha256": sha256, "state": "ready"})

    def submit(self, body: dict) -> Reply:
        workdir = body.get("workdir") or {}
        team = body.get("team") or self.team
        if workdir.get("kind") == "archive":
            row = self.packs.get((team, workdir["sha256"], bool(body.get("encrypt_checkpoints"))))
            if row is None or row.state != "ready":
                return Reply(422, {"detail": "upload the code first"})
        self.jobs.append(body)
        job = {"id": len(self.jobs), "name": body["name"], "team": team, "state": "queued"}
        return Reply(200, job)

    # ---- storage ------------------------------------------------------------------------------

    def presign(self, key: str) -> str:
        return f"{self.url}/storage/{key}?X-Amz-Signature={signature(key)}"

    def storage_put(self, seen: Seen) -> Reply:
        parts = urlsplit(seen.path)
        key = parts.path.removeprefix("/storage/")
        given = parse_qs(parts.query).get("X-Amz-Signature", [""])[0]
        if seen.method != "PUT" or not hmac.compare_digest(given, signature(key)):
            return Reply(403, {"detail": "SignatureDoesNotMatch"})
        if "authorization" in seen.headers:
            return Reply(400, {"detail": "Only one auth mechanism allowed"})
        if "content-length" not in seen.headers:
            return Reply(411, {"detail": "MissingContentLength"})
        body = seen.body
        if self.corrupt_next_storage_put:
            self.corrupt_next_storage_put, body = False, body[:-1] + bytes([body[-1] ^ 1])
        self.objects[key] = body
        return Reply(200)


def signature(key: str) -> str:
    return hmac.new(SIGNING_KEY, key.encode(), hashlib.sha256).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        body = self.rfile.read(int(length)) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.standin.handle(Seen(self.command, self.path, headers, body))
        payload = b"" if reply.body is None else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    standin: StandIn


def serve(standin: StandIn) -> _Server:
    """Serve STANDIN on a free loopback port (``standin.url``); ``shutdown()`` stops it."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.standin = standin
    standin.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
