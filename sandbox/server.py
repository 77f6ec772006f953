"""The sandbox's HTTP server: the app (store, market, engine, rate limiter), and each request's
way through it: route, rate limit, auth, handler, reply.

Vast endpoints (``vast_api.py``) follow ``docs/vast-api.md``: paths with or without the trailing
slash, structured query parameters JSON-encoded then URL-encoded, JSON bodies, Vast's error
shape and its endpoint-specific auth failures (401 on instances; 403 without a key and 404
``auth_error`` for an unknown key on charges and v1 invoices; offer search needs none).
Sandbox-only endpoints (``sandbox_api.py``) live under ``/sandbox/`` and need no key (it is a
local test bed). Requests with an absolute URL are an instance's metered proxy traffic
(``traffic.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sandbox import billing, sandbox_api, traffic, vast_api, weather
from sandbox.bids import BidMarket, BidSettings
from sandbox.engine import Engine
from sandbox.engine.upkeep import run_ticker
from sandbox.errors import ApiError
from sandbox.image_cache import GUESSED_WIPE_CHANCE
from sandbox.market import Market
from sandbox.messages import (
    Reply,
    Request,
    credential_of,
    parse_params,
    read_json_body,
    send,
)
from sandbox.query import QueryError
from sandbox.ratelimit import RateLimiter
from sandbox.routes import Route, match
from sandbox.state import Store, ensure_accounts
from sandbox.timing import Timing

ROUTES: list[Route] = [*vast_api.ROUTES, *sandbox_api.ROUTES]


@dataclass
class Options:
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8700
    market: Path | None = None
    seed: int | None = None
    api_keys: list[str] = field(default_factory=lambda: ["sandbox-key"])
    credit: float = 100.0
    relaxed_rate_limits: bool = False
    retry_after: bool = False
    timing: Timing = field(default_factory=Timing)
    bids: BidSettings = field(default_factory=BidSettings.off)
    bill_image_pull: bool = True
    image_wipe_chance: float = GUESSED_WIPE_CHANCE
    market_weather: str = weather.NONE
    verbose: bool = False


class App:
    """The sandbox: store, market, engine, rate limiter; routing, rate limits and auth."""

    def __init__(self, options: Options) -> None:
        self.options = options
        options.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(options.state_dir / "sandbox.sqlite3")
        self.market = Market.from_file(options.market, options.seed)
        # The min_bid walk counts sandbox hours from the state's first start, so a restart
        # (or a second run with the same seed and a fresh state) walks the same way.
        epoch = float(self.store.meta("bid_epoch") or time.time())
        self.store.set_meta("bid_epoch", repr(epoch))
        self.bids = BidMarket(
            self.market.offers, options.bids, options.seed, options.timing.hour_s, epoch
        )
        self.engine = Engine(
            self.store,
            self.market,
            options.timing,
            options.state_dir,
            options.bill_image_pull,
            bids=self.bids,
            wipe_chance=options.image_wipe_chance,
            market_weather=options.market_weather,
        )
        self.limiter = RateLimiter(
            enabled=not options.relaxed_rate_limits, scaled=options.timing.rate_interval
        )
        ensure_accounts(self.store, options.api_keys, options.credit, time.time())

    def dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        path = url.path.rstrip("/") or "/"
        found = match(ROUTES, handler.command, path)
        if isinstance(found, Reply):
            handler.close_connection = True  # the body, if any, was not read
            return send(handler, found)
        rt, ids = found
        params = parse_params(url.query)
        credential = credential_of(handler, params)
        limited = self._rate_limited(handler, rt, path, credential)
        if limited is not None:
            handler.close_connection = True
            return send(handler, limited)
        reply = self._handle(
            handler, rt, Request(handler.command, params, None, ids, handler), credential
        )
        if reply is not None:
            send(handler, reply)

    def _rate_limited(
        self, handler: BaseHTTPRequestHandler, rt: Route, path: str, credential: str
    ) -> Reply | None:
        if not path.startswith("/api/"):
            return None
        verdict = self.limiter.check(
            handler.command, rt.name, credential, handler.client_address[0]
        )
        if verdict.allowed:
            return None
        headers = {"Retry-After": f"{verdict.retry_after:.0f}"} if self.options.retry_after else {}
        return Reply(429, verdict.body, headers)

    def _handle(
        self, handler: BaseHTTPRequestHandler, rt: Route, req: Request, credential: str
    ) -> Reply | None:
        """Run one handler; every failure becomes a reply in Vast's error shape."""
        try:
            req.body = None if rt.raw else read_json_body(handler)
            self._authenticate(rt, req, credential)
            return rt.fn(self, req)
        except ApiError as exc:
            return Reply(exc.status, exc.body())
        except (QueryError, billing.BillingError) as exc:
            error = getattr(exc, "error", "invalid_args")
            return Reply(400, {"success": False, "error": error, "msg": str(exc)})
        except Exception as exc:  # a bug here must not take the sandbox down
            traceback.print_exc()
            return Reply(500, {"success": False, "error": "server_error", "msg": repr(exc)})

    def _authenticate(self, rt: Route, req: Request, credential: str) -> None:
        if rt.auth in ("none", "sandbox"):
            return
        account = (
            self.store.row("SELECT * FROM accounts WHERE api_key = ?", (credential,))
            if credential
            else None
        )
        if account is None and credential:
            account = self._instance_key_account(rt, req, credential)
        if account is not None:
            req.account = account
            return
        if rt.auth == "billing":
            if not credential:
                raise ApiError(403, "auth_error", "This action requires login.")
            raise ApiError(404, "auth_error", "Invalid user key")
        raise ApiError(401, "auth_error", "Invalid user key")

    def _instance_key_account(self, rt: Route, req: Request, credential: str) -> dict | None:
        """An instance's CONTAINER_API_KEY may show, start/stop, reboot and destroy that
        instance only (``docs/vast-api.md`` §3)."""
        inst = self.store.row(
            "SELECT id, account_id FROM instances WHERE api_key = ?", (credential,)
        )
        if inst is None or rt.name not in ("instance", "reboot") or req.ids.get("id") != inst["id"]:
            return None
        req.scope = inst["id"]
        return self.store.row("SELECT * FROM accounts WHERE id = ?", (inst["account_id"],))

    # ---- running -----------------------------------------------------------------------------

    def serve(self) -> None:
        """Bind, recover instances from the last run, and serve until SIGTERM / Ctrl-C."""
        server = SandboxServer((self.options.host, self.options.port), Handler, self)
        host, port = server.server_address[:2]
        self.engine.url = f"http://{host}:{port}"
        self.engine.recover()
        stop = threading.Event()
        tick = 0.02 if self.options.timing.scale < 1 else 0.1
        threading.Thread(target=run_ticker, args=(self.engine, tick, stop), daemon=True).start()
        _write_server_file(self.options.state_dir, self.engine.url)
        print(
            f"sandbox marketplace on {self.engine.url} (state in {self.options.state_dir})",
            flush=True,
        )
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            stop.set()
            self.engine.shutdown()
            server.server_close()


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # bursts of parallel renters must not be refused

    def __init__(self, address: tuple[str, int], handler: type, app: App) -> None:
        super().__init__(address, handler)
        self.app = app


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections, as with Vast
    # Headers and body go out in two writes; with Nagle on, a kept-alive connection waits
    # for the client's delayed ACK (~40 ms) before the body.
    disable_nagle_algorithm = True
    server_version = "sandbox-vast/1"
    server: SandboxServer

    def _any(self) -> None:
        if self.path.startswith("http://"):
            traffic.forward(self, self.server.app.engine)
        else:
            self.server.app.dispatch(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any

    def do_CONNECT(self) -> None:
        traffic.tunnel(self, self.server.app.engine)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.options.verbose:
            super().log_message(format, *args)


def _write_server_file(state_dir: Path, url: str) -> None:
    """``server.json`` tells scripts and tests where this run listens."""
    tmp = state_dir / "server.json.tmp"
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    tmp.replace(state_dir / "server.json")
