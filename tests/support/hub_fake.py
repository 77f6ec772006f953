"""A local HTTP server that speaks the parts of the Hugging Face Hub that staging uses, with
the Hub's answers (as ``huggingface_hub`` reads them, ``utils/_http.py hf_raise_for_status``):

- ``GET /api/models/{repo}/revision/{rev}[?blobs=true]``: ``{"id", "sha", "siblings":
  [{"rfilename", "size"?}]}``; a repo that does not exist (or is private) answers 401 to an
  anonymous caller and 404 to a token, ``X-Error-Code: RepoNotFound``; an unknown revision
  404 ``RevisionNotFound``. A gated repo's info is public, as on the Hub;
- ``GET|HEAD /{repo}/resolve/{rev}/{path}``: the file with ``X-Repo-Commit`` and ``ETag`` (a
  git blob id), or for an LFS file (``*.safetensors``, ``*.bin``) a 302 to a CDN path with
  ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``; a gated repo without the right token
  401 ``GatedRepo``; a missing file 404 ``EntryNotFound``.

It counts the bytes it served per path (``served``), so a test can see a mirror made once.
Faults: ``fail_next`` answers its statuses (503, 429 with ``Retry-After: 1``) to the next
requests, one each; ``running(refusing=True)`` holds its port without listening, so every
connection is refused (ECONNREFUSED) until ``hub.listen()``; ``running(self_signed=True)``
serves HTTPS with a certificate no CA signed; ``silent()`` is a Hub that takes connections and
never answers (until it closes them).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
import ssl
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""
    gated: bool = False
    private: bool = False
    revisions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(json.dumps(sorted(self.files)).encode(), usedforsecurity=False)
        self.commit = self.commit or digest.hexdigest()
        self.revisions.setdefault("main", self.commit)


@dataclass
class FakeHub:
    url: str = ""
    token: str = "hf_fake_valid_token"
    repos: dict[str, Repo] = field(default_factory=dict)
    served: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fail_next: list[int] = field(default_factory=list)
    listen: Callable[[], None] = lambda: None  # set by ``running``: start answering

    def commit_of(self, repo: str, revision: str) -> str | None:
        found = self.repos.get(repo)
        if found is None:
            return None
        return found.revisions.get(revision) or (revision if revision == found.commit else None)


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            with hub.lock:
                fault = hub.fail_next.pop(0) if hub.fail_next else None
            if fault is not None:
                retry = {"Retry-After": "1"} if fault == 429 else {}
                self._raw(fault, b'{"error": "injected"}', retry, body=body)
                return None
            path = unquote(urlsplit(self.path).path)
            authorised = self.headers.get("Authorization") == f"Bearer {hub.token}"
            if path.startswith("/api/models/"):
                return self._info(path.removeprefix("/api/models/"), authorised, body)
            if path.startswith("/cdn/"):
                return self._cdn(path.removeprefix("/cdn/"), body)
            parts = path.strip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, rev, file = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                return self._resolve(repo, rev, file, authorised, body)
            self._send(404, {"error": "not found"}, body=body)

        def _repo_or_refuse(self, repo: str, authorised: bool, body: bool) -> Repo | None:
            found = hub.repos.get(repo)
            if found is None or (found.private and not authorised):
                status = 404 if authorised else 401
                self._send(status, {"error": "Repository not found"}, "RepoNotFound", body=body)
                return None
            return found

        def _info(self, rest: str, authorised: bool, body: bool) -> None:
            repo, _, rev = rest.partition("/revision/")
            found = self._repo_or_refuse(repo, authorised, body)
            if found is None:
                return
            commit = hub.commit_of(repo, rev or "main")
            if commit is None:
                self._send(404, {"error": "Invalid rev id"}, "RevisionNotFound", body=body)
                return
            blobs = "blobs=true" in (urlsplit(self.path).query or "")
            siblings = [
                {"rfilename": name, **({"size": len(data)} if blobs else {})}
                for name, data in sorted(found.files.items())
            ]
            info = {"id": repo, "sha": commit, "siblings": siblings}
            self._send(200, {**info, "gated": "manual" if found.gated else False}, body=body)

        def _resolve(self, repo: str, rev: str, file: str, authorised: bool, body: bool) -> None:
            found = self._repo_or_refuse(repo, authorised, body)
            if found is None:
                return
            if found.gated and not authorised:
                self._send(401, {"error": "Access to model is restricted"}, "GatedRepo", body=body)
                return
            commit = hub.commit_of(repo, rev)
            data = found.files.get(file)
            if commit is None or data is None:
                self._send(404, {"error": "Entry not found"}, "EntryNotFound", body=body)
                return
            headers = {"X-Repo-Commit": commit}
            if file.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
                headers["Location"] = f"{hub.url}/cdn/{repo}/{file}"
                self._raw(302, b"", headers, body=body)
                return
            headers["ETag"] = f'"{git_blob_id(data)}"'
            self._serve(f"{repo}/{file}", data, headers, body)

        def _cdn(self, rest: str, body: bool) -> None:
            repo, _, file = "/".join(rest.split("/")[:2]), None, "/".join(rest.split("/")[2:])
            data = hub.repos[repo].files.get(file) if repo in hub.repos else None
            if data is None:
                self._send(404, {"error": "no such object"}, body=body)
                return
            self._serve(
                f"{repo}/{file}",
                data,
                {"ETag": f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'},
                body,
            )

        def _serve(self, key: str, data: bytes, headers: dict, body: bool) -> None:
            if body:
                with hub.lock:
                    hub.served[key] += len(data)
            self._raw(200, data, headers, body=body)

        def _send(self, status: int, payload: dict, code: str = "", *, body: bool) -> None:
            headers = {"Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            self._raw(status, json.dumps(payload).encode(), headers, body=body)

        def _raw(self, status: int, data: bytes, headers: dict, *, body: bool) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@contextmanager
def running(
    hub: FakeHub | None = None, *, refusing: bool = False, self_signed: bool = False
) -> Iterator[FakeHub]:
    """HUB (a fresh one by default) served on a free local port until the block ends; with
    REFUSING, the port is bound but not listening (connections refused) until ``hub.listen()``;
    with SELF_SIGNED, over HTTPS with a certificate no CA signed."""
    hub = hub or FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub), bind_and_activate=False)
    server.daemon_threads = True
    server.server_bind()
    scheme = "http"
    if self_signed:
        server.socket = _self_signed_context().wrap_socket(server.socket, server_side=True)
        scheme = "https"
    hub.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)

    def listen() -> None:
        server.server_activate()
        thread.start()

    hub.listen = listen
    if not refusing:
        listen()
    try:
        yield hub
    finally:
        if thread.is_alive():
            server.shutdown()
        server.server_close()


@contextmanager
def silent() -> Iterator[str]:
    """The URL of a server that accepts connections (the kernel's backlog does) and never
    answers: a request waits for its read timeout, or until the block ends and the connections
    are reset."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _self_signed_context() -> ssl.SSLContext:
    """A server context whose certificate (for 127.0.0.1) signs itself."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake hub")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    with tempfile.TemporaryDirectory() as folder:
        pem = Path(folder) / "hub.pem"
        pem.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)
    return context
