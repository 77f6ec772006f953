"""A local webhook receiver that does what a careful receiver does: checks the timestamp is
recent and the signature matches ``sha256=HMAC-SHA256(secret, "<timestamp>.<body>")`` with a
constant-time compare, and only then accepts the JSON. Written from the contract, not from
``notify.transports``, so it checks the sender rather than agreeing with it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_S = 300


@dataclass
class Receiver:
    secret: str
    url: str = ""
    accepted: list[dict] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    queued: list[tuple[int, dict]] = field(default_factory=list)  # (status, extra headers)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer_next(self, status: int, **headers: str) -> None:
        with self.lock:
            self.queued.append((status, headers))

    def events(self) -> list[str]:
        with self.lock:
            return [body["event"] for body in self.accepted]

    def check(self, headers, body: bytes, now: float) -> tuple[int, str]:
        timestamp = headers.get("X-NomadGPU-Timestamp", "")
        signature = headers.get("X-NomadGPU-Signature", "")
        if not timestamp.isdigit() or abs(now - int(timestamp)) > TOLERANCE_S:
            return 400, "timestamp missing or outside the window"
        signed = timestamp.encode() + b"." + body
        expected = "sha256=" + hmac.new(self.secret.encode(), signed, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            return 401, "bad signature"
        return 200, "ok"

    def receive(self, headers, body: bytes) -> tuple[int, dict]:
        status, why = self.check(headers, body, time.time())
        with self.lock:
            if status != 200:
                self.rejected.append((status, why))
                return status, {}
            if self.queued:
                return self.queued.pop(0)
            self.accepted.append(json.loads(body))
            self.headers.append(dict(headers))
            return 200, {}


def handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, extra = receiver.receive(self.headers, body)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    return Handler


@contextmanager
def running(secret: str) -> Iterator[Receiver]:
    """A receiver on a free local port (its URL in ``.url``), for as long as the block runs."""
    receiver = Receiver(secret=secret)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(receiver))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/nomadgpu"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
