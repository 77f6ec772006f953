"""Metered traffic: what an instance downloads and uploads, like the host's NIC counter.

Three ways bytes reach the meter, all throttled to the offer's ``inet_down`` / ``inet_up``
(Mbit/s, divided by the timing scale; a download gets the machine's share of ``inet_down`` under
a market weather, ``weather.py``):

* ``GET /sandbox/download/{id}?bytes=N`` streams N bytes to the instance (a simulated image
  or model download);
* ``PUT|POST /sandbox/upload/{id}`` swallows a body from the instance (a checkpoint upload);
* the forward proxy every instance gets as ``HTTP_PROXY``/``HTTPS_PROXY`` (``NO_PROXY``
  empty): plain-HTTP requests are relayed and counted whole (request line, headers, body
  each way); HTTPS goes through ``CONNECT`` and every tunnelled byte is counted.

Requests that arrive through the proxy carry ``X-Sandbox-Metered`` so the download and
upload endpoints do not count them a second time. Not metered: traffic that bypasses the
proxy (raw sockets, or a client told to ignore proxy variables).

What is metered here is also added to the instance's own interface counters, a file in
``/proc/net/dev``'s format that its agent reads (``NOMAD_NET_DEV``) as a container reads its
NIC's; the image pull is not in it, as a pull is not in a container's counters.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import http.client
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

from sandbox.engine import Engine
from sandbox.processes import NET_DEV_FILE

CHUNK = 64 * 1024
FLUSH_S = 1.0
METERED_HEADER = "X-Sandbox-Metered"
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}


class Meter:
    """Counts one instance's bytes in one direction, writing them out about once a second
    so a long transfer bills progressively (charges for a window see partial transfers)."""

    def __init__(self, engine: Engine, inst_id: int, direction: str, enabled: bool = True) -> None:
        self.engine, self.inst_id, self.direction, self.enabled = (
            engine,
            inst_id,
            direction,
            enabled,
        )
        self.pending, self.total, self.flushed_at = 0, 0, time.monotonic()

    def add(self, nbytes: int) -> None:
        self.pending += nbytes
        self.total += nbytes
        if time.monotonic() - self.flushed_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.enabled and self.pending:
            self.engine.add_traffic(self.inst_id, self.direction, self.pending)
            count_in_container(self.engine.scratch(self.inst_id), self.direction, self.pending)
        self.pending, self.flushed_at = 0, time.monotonic()


_NET_DEV_LOCK = threading.Lock()  # meters of one instance flush from several request threads
NET_DEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast"
    "|bytes    packets errs drop fifo colls carrier compressed\n"
)
NET_DEV_TX_COLUMN = 8  # after the eight receive columns: bytes packets errs drop fifo frame ...


def count_in_container(scratch: Path, direction: str, nbytes: int) -> None:
    """Add NBYTES to the instance's interface counters (``eth0`` of its ``net_dev`` file)."""
    path = scratch / NET_DEV_FILE
    with _NET_DEV_LOCK, contextlib.suppress(OSError):  # a destroyed instance's folder is gone
        rx, tx = _eth0_counters(path.read_text()) if path.exists() else (0, 0)
        rx, tx = (rx + nbytes, tx) if direction == "down" else (rx, tx + nbytes)
        tmp = path.with_name(f".{NET_DEV_FILE}.tmp")
        tmp.write_text(
            f"{NET_DEV_HEADER}    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
            f"  eth0: {rx} 0 0 0 0 0 0 0 {tx} 0 0 0 0 0 0 0\n"
        )
        os.replace(tmp, path)  # the agent reads a whole file, never half of one


def _eth0_counters(text: str) -> tuple[int, int]:
    """Received and transmitted bytes of the ``eth0`` line that ``count_in_container`` wrote:
    /proc/net/dev's columns 1 and 9 after the colon (proc(5)); (0, 0) when there is none."""
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if colon and name.strip() == "eth0" and len(fields) > NET_DEV_TX_COLUMN:
            with contextlib.suppress(ValueError):
                return int(fields[0]), int(fields[NET_DEV_TX_COLUMN])
    return 0, 0


class Throttle:
    """Paces a stream to a byte rate."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate, self.sent, self.start = bytes_per_s, 0, time.monotonic()

    def pace(self, nbytes: int) -> None:
        self.sent += nbytes
        ahead = self.sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def _link(engine: Engine, inst: dict, direction: str) -> Throttle:
    """The instance's link in DIRECTION: what the offer advertises, less the share the market
    weather's machine traits take from a download (``engine.link_mbps``)."""
    return Throttle(engine.timing.bytes_per_s(engine.link_mbps(inst, direction)))


def _live(engine: Engine, inst_id: int) -> dict | None:
    inst = engine.get(inst_id)
    if inst is None or inst["destroyed_at"] is not None or not inst["host_online"]:
        return None
    return inst


def download(handler: BaseHTTPRequestHandler, engine: Engine, inst_id: int, nbytes: int) -> None:
    """Stream ``nbytes`` zero bytes to an instance at its download speed."""
    inst = _live(engine, inst_id)
    if inst is None:
        handler.send_error(404, "no such live instance")
        return
    meter = Meter(engine, inst_id, "down", enabled=handler.headers.get(METERED_HEADER) is None)
    throttle, block = _link(engine, inst, "down"), bytes(CHUNK)
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(nbytes))
    handler.end_headers()
    left = nbytes
    try:
        while left > 0:
            piece = block[: min(CHUNK, left)]
            handler.wfile.write(piece)
            left -= len(piece)
            meter.add(len(piece))
            throttle.pace(len(piece))
    except OSError:
        handler.close_connection = True  # the instance hung up: bill what it got
    finally:
        meter.flush()


def upload(handler: BaseHTTPRequestHandler, engine: Engine, inst_id: int) -> int | None:
    """Swallow a request body from an instance at its upload speed; returns the byte count."""
    inst = _live(engine, inst_id)
    if inst is None:
        handler.close_connection = True
        return None
    meter = Meter(engine, inst_id, "up", enabled=handler.headers.get(METERED_HEADER) is None)
    throttle = _link(engine, inst, "up")
    try:
        for piece in read_body(handler):
            meter.add(len(piece))
            throttle.pace(len(piece))
    finally:
        meter.flush()
    return meter.total


def read_body(handler: BaseHTTPRequestHandler) -> Iterator[bytes]:
    """The request body in pieces, by Content-Length or chunked transfer coding."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        yield from _read_chunked(handler)
        return
    left = int(handler.headers.get("Content-Length") or 0)
    while left > 0:
        piece = handler.rfile.read(min(CHUNK, left))
        if not piece:
            raise ConnectionError("body ended early")
        left -= len(piece)
        yield piece


def _read_chunked(handler: BaseHTTPRequestHandler) -> Iterator[bytes]:
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return
        while size > 0:
            piece = handler.rfile.read(min(CHUNK, size))
            if not piece:
                raise ConnectionError("chunk ended early")
            size -= len(piece)
            yield piece
        handler.rfile.readline()


# ---- the forward proxy ------------------------------------------------------------------------


def proxy_instance(handler: BaseHTTPRequestHandler, engine: Engine) -> dict | None:
    """The instance behind a proxy request (``Proxy-Authorization: Basic i<id>:<key>``)."""
    auth = handler.headers.get("Proxy-Authorization", "")
    scheme, _, encoded = auth.partition(" ")
    try:
        user, _, key = base64.b64decode(encoded).decode().partition(":")
        inst = engine.get(int(user.removeprefix("i"))) if scheme.lower() == "basic" else None
    except (binascii.Error, UnicodeDecodeError, ValueError):
        inst = None
    # A destroyed instance whose destroy has not reached its host yet still has a network.
    gone = inst is not None and inst["destroyed_at"] is not None and inst["pgid"] is None
    if inst is None or inst["api_key"] != key or gone:
        handler.send_response(407)
        handler.send_header("Proxy-Authenticate", 'Basic realm="sandbox"')
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return None
    return inst


def forward(handler: BaseHTTPRequestHandler, engine: Engine) -> None:
    """Relay one absolute-URI (``GET http://host/path``) request and meter both directions."""
    inst = proxy_instance(handler, engine)
    if inst is None:
        return
    billed = inst["destroyed_at"] is None  # the renter pays nothing after the destroy
    up, down = Meter(engine, inst["id"], "up", billed), Meter(engine, inst["id"], "down", billed)
    up_link, down_link = _link(engine, inst, "up"), _link(engine, inst, "down")
    up.add(len(handler.requestline) + 2 + len(bytes(handler.headers)))
    target = urlsplit(handler.path)
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
    headers[METERED_HEADER] = str(inst["id"])
    chunked = handler.headers.get("Transfer-Encoding", "").lower() == "chunked"
    has_body = chunked or int(handler.headers.get("Content-Length") or 0) > 0

    def body() -> Iterator[bytes]:
        for piece in read_body(handler):
            up.add(len(piece))
            up_link.pace(len(piece))
            yield piece

    conn = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=300)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    try:
        # No body object for a bodyless request, or http.client would send an empty chunked one.
        payload = body() if has_body else None
        conn.request(handler.command, path, body=payload, headers=headers, encode_chunked=chunked)
        _relay_response(handler, conn.getresponse(), down, down_link)
    except OSError as exc:
        handler.close_connection = True  # a request body may be left unread
        if down.total == 0:  # nothing relayed yet: the client can still get an answer
            handler.send_error(502, f"upstream: {exc}")
    finally:
        conn.close()
        up.flush()
        down.flush()


def _relay_response(
    handler: BaseHTTPRequestHandler, resp: http.client.HTTPResponse, meter: Meter, link: Throttle
) -> None:
    head = [f"HTTP/1.1 {resp.status} {resp.reason}"]
    head += [f"{k}: {v}" for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
    if resp.getheader("Content-Length") is None and handler.command != "HEAD":
        head.append("Connection: close")  # the body ends when the connection does
        handler.close_connection = True
    raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    handler.wfile.write(raw)
    meter.add(len(raw))
    while piece := resp.read(CHUNK):
        handler.wfile.write(piece)
        meter.add(len(piece))
        link.pace(len(piece))


def tunnel(handler: BaseHTTPRequestHandler, engine: Engine) -> None:
    """``CONNECT host:port``: relay an opaque (TLS) stream, counting every byte each way."""
    inst = proxy_instance(handler, engine)
    if inst is None:
        return
    host, _, port = handler.path.rpartition(":")
    try:
        upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
    except (OSError, ValueError) as exc:
        handler.send_error(502, f"cannot reach {handler.path}: {exc}")
        return
    handler.wfile.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
    handler.wfile.flush()
    handler.close_connection = True
    billed = inst["destroyed_at"] is None
    meters = {d: Meter(engine, inst["id"], d, billed) for d in ("up", "down")}
    links = {"up": _link(engine, inst, "up"), "down": _link(engine, inst, "down")}
    try:
        # Clients send nothing after CONNECT until the 200 arrives, so rfile holds no
        # buffered bytes and the raw socket can be relayed directly.
        _pump(handler.connection, upstream, meters, links)
    finally:
        upstream.close()
        for m in meters.values():
            m.flush()


def _pump(
    client: socket.socket,
    upstream: socket.socket,
    meters: dict[str, Meter],
    links: dict[str, Throttle],
) -> None:
    sel = selectors.DefaultSelector()
    sel.register(client, selectors.EVENT_READ, ("up", upstream))
    sel.register(upstream, selectors.EVENT_READ, ("down", client))
    try:
        while events := sel.select(timeout=300):  # five idle minutes end the tunnel
            for key, _ in events:
                direction, other = key.data
                data = key.fileobj.recv(CHUNK)
                if not data:
                    return
                other.sendall(data)
                meters[direction].add(len(data))
                links[direction].pace(len(data))
    except OSError:
        return
    finally:
        sel.close()
