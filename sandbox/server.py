"""The HTTP side: routing, auth, rate limits and the handlers of every endpoint.

Vast endpoints follow ``docs/vast-api.md``: paths with or without the trailing slash,
structured query parameters JSON-encoded then URL-encoded, JSON bodies, Vast's error shape
and its endpoint-specific auth failures (401 on instances; 403 without a key and 404
``auth_error`` for an unknown key on charges and v1 invoices; offer search needs none).
Sandbox-only endpoints live under ``/sandbox/`` and need no key (it is a local test bed).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sandbox import billing, traffic
from sandbox.bids import BidMarket, BidSettings
from sandbox.engine import Engine
from sandbox.engine.upkeep import run_ticker
from sandbox.errors import ApiError
from sandbox.image_cache import GUESSED_WIPE_CHANCE
from sandbox.market import Market
from sandbox.query import QueryError
from sandbox.ratelimit import RateLimiter
from sandbox.state import Store, add_payment, ensure_accounts
from sandbox.timing import Timing
from sandbox.views import instance_json, list_instances

MAX_BODY = 16 * 1024 * 1024
RAW_PARAMS = {"api_key", "after_token", "owner"}  # strings even when they look like JSON


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
    verbose: bool = False


@dataclass
class Request:
    method: str
    params: dict[str, Any]
    body: Any
    ids: dict[str, int]
    handler: BaseHTTPRequestHandler
    account: dict | None = None
    scope: int | None = None  # set when an instance's own key was used


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    name: str
    auth: str  # none | user | billing | sandbox
    fn: Callable[[App, Request], Reply | None]
    raw: bool = False  # the handler reads the body / writes the response itself


def route(method: str, path: str, name: str, auth: str, raw: bool = False) -> Callable:
    def register(fn: Callable) -> Callable:
        ROUTES.append(Route(method, re.compile(path + "$"), name, auth, fn, raw))
        return fn

    return register


ROUTES: list[Route] = []


def ok(body: Any = None, status: int = 200) -> Reply:
    return Reply(status, {"success": True} if body is None else body)


class App:
    """The sandbox: store, market, engine, rate limiter, and the endpoint handlers."""

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
        )
        self.limiter = RateLimiter(
            enabled=not options.relaxed_rate_limits, scaled=options.timing.rate_interval
        )
        ensure_accounts(self.store, options.api_keys, options.credit, time.time())

    # ---- plumbing ------------------------------------------------------------------------

    def dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        path = url.path.rstrip("/") or "/"
        found = _match(handler.command, path)
        if isinstance(found, Reply):
            handler.close_connection = True  # the body, if any, was not read
            return _send(handler, found)
        rt, ids = found
        params = _params(url.query)
        credential = _credential(handler, params)
        limited = self._rate_limited(handler, rt, path, credential)
        if limited is not None:
            handler.close_connection = True
            return _send(handler, limited)
        reply = self._handle(
            handler, rt, Request(handler.command, params, None, ids, handler), credential
        )
        if reply is not None:
            _send(handler, reply)

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
            req.body = None if rt.raw else _body(handler)
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

    def _owned(self, req: Request) -> dict:
        inst = self.engine.owned(req.account["id"], req.ids["id"])
        if inst is None:
            raise ApiError(
                404,
                "no_such_instance",
                f"error 404/3602: no_such_instance  Instance {req.ids['id']} not found.",
            )
        return inst

    # ---- offer search --------------------------------------------------------------------

    def _search(self, query: Any, select_cols: Any = None) -> Reply:
        if not isinstance(query, dict):
            raise QueryError("the query must be a JSON object")
        now = time.time()
        rented = self.engine.rented_asks()
        offers = self.market.search(
            query, rented, self.engine.gone_asks(), now, self._min_bids(rented, now)
        )
        if isinstance(select_cols, list) and select_cols and select_cols != ["*"]:
            offers = [{c: o.get(c) for c in select_cols} for o in offers]
        return Reply(200, {"offers": offers})

    def _min_bids(self, rented: set[int], now: float) -> Callable[[int], float]:
        """Each ask's min_bid now: the walk's, or the bid of a tenant holding the machine."""
        rivals = {
            r["ask_id"]: r["rival_bid"]
            for r in self.store.rows(
                "SELECT ask_id, rival_bid FROM instances"
                " WHERE destroyed_at IS NULL AND rival_bid IS NOT NULL"
            )
        }
        return lambda ask: max(self.bids.floor(ask, now), rivals.get(ask) or 0.0)

    @route("POST", "/api/v0/bundles", "bundles", "none")
    def search_post(self, req: Request) -> Reply:
        return self._search(req.body if req.body is not None else {})

    @route("GET", "/api/v0/bundles", "bundles", "none")
    def search_get(self, req: Request) -> Reply:
        return self._search(req.params.get("q", {}), req.params.get("select_cols"))

    @route("PUT", "/api/v0/search/asks", "search_asks", "none")
    def search_put(self, req: Request) -> Reply:
        body = req.body or {}
        return self._search(body.get("q", {}), body.get("select_cols"))

    # ---- instances -----------------------------------------------------------------------

    @route("PUT", r"/api/v0/asks/(?P<id>\d+)", "ask", "user")
    def create(self, req: Request) -> Reply:
        return ok(
            self.engine.create(
                req.account["id"], req.ids["id"], req.body if req.body is not None else {}
            )
        )

    @route("GET", "/api/v1/instances", "instances_v1", "user")
    def list_v1(self, req: Request) -> Reply:
        return ok(list_instances(self.engine, req.account["id"], req.params, time.time()))

    @route("GET", "/api/v0/instances", "instances_v0", "user")
    def list_v0(self, req: Request) -> Reply:
        # Accounts created after 2026-06-02 get 410 here; every sandbox account is new.
        raise ApiError(
            410,
            "deprecated",
            "GET /api/v0/instances/ is no longer available; use /api/v1/instances/.",
        )

    @route("GET", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
    def show(self, req: Request) -> Reply:
        inst = self.engine.owned(req.account["id"], req.ids["id"])
        return ok({"instances": instance_json(self.engine, inst, time.time()) if inst else None})

    @route("PUT", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
    def update(self, req: Request) -> Reply:
        inst, body = self._owned(req), req.body if isinstance(req.body, dict) else {}
        if "state" in body:
            if body["state"] == "stopped":
                self.engine.stop(inst, renter=True)
                return ok()
            if body["state"] == "running":
                return ok(self.engine.start(inst))
            raise ApiError(400, "invalid_args", "state must be 'running' or 'stopped'")
        if "label" in body:
            self.engine.set_label(inst, body["label"])
            return ok()
        raise ApiError(400, "invalid_args", "nothing to change: send 'state' or 'label'")

    @route("DELETE", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
    def destroy(self, req: Request) -> Reply:
        self.engine.destroy(self._owned(req))
        return ok({"success": True, "msg": f"Instance {req.ids['id']} destroyed."})

    @route("PUT", r"/api/v0/instances/bid_price/(?P<id>\d+)", "bid_price", "user")
    def change_bid(self, req: Request) -> Reply:
        inst = self.engine.owned(req.account["id"], req.ids["id"])
        if inst is None:  # the change-bid spec's own 404 (vast-ai/docs openapi.yaml)
            raise ApiError(404, "no_such_instance", "Instance with that ID does not exist.")
        return ok(self.engine.change_bid(inst, req.body if req.body is not None else {}))

    @route("PUT", r"/api/v0/instances/reboot/(?P<id>\d+)", "reboot", "user")
    def reboot(self, req: Request) -> Reply:
        self.engine.reboot(self._owned(req))
        return ok()

    # ---- account and billing -------------------------------------------------------------

    @route("GET", "/api/v0/users/current", "user", "user")
    def user(self, req: Request) -> Reply:
        account = req.account
        return ok(
            {
                "id": account["id"],
                "email": account["email"],
                "username": f"user{account['id']}",
                "fullname": "Sandbox User",
                "credit": billing.credit(self.store, account["id"], time.time()),
                # Vast's `balance` (legacy unpaid-invoice total) has no meaning with prepaid credit.
                "balance": 0.0,
                "ssh_key": "",
                "has_billing": True,
                "created_at": account["created_at"],
            }
        )

    @route("GET", "/api/v0/charges", "charges", "billing")
    def charges(self, req: Request) -> Reply:
        return ok(billing.charges(self.store, req.account["id"], req.params, time.time()))

    @route("GET", "/api/v1/invoices", "invoices_v1", "billing")
    def invoices(self, req: Request) -> Reply:
        return ok(billing.invoices(self.store, req.account["id"], req.params, time.time()))

    # ---- sandbox-only ----------------------------------------------------------------------

    @route("GET", "/sandbox/health", "health", "sandbox")
    def health(self, req: Request) -> Reply:
        o = self.options
        return ok(
            {
                "ok": True,
                "url": self.engine.url,
                "seed": o.seed,
                "time_scale": o.timing.scale,
                "sandbox_hour_s": o.timing.hour_s,
                "bids": {
                    "outbid_rate_per_h": o.bids.outbid_rate_per_h,
                    "outbid_margin_scale": o.bids.margin_scale,
                    "outbid_hold_h": o.bids.hold_h,
                    "min_bid_step_pct": o.bids.min_bid_step_pct,
                },
                "relaxed_rate_limits": o.relaxed_rate_limits,
                "offers": len(self.market.offers),
            }
        )

    @route("GET", "/sandbox/instances", "sandbox_instances", "sandbox")
    def sandbox_instances(self, req: Request) -> Reply:
        ids = [r["id"] for r in self.store.rows("SELECT id FROM instances ORDER BY id")]
        return ok({"instances": [self.engine.debug_view(i) for i in ids]})

    @route("GET", r"/sandbox/instances/(?P<id>\d+)", "sandbox_instance", "sandbox")
    def sandbox_instance(self, req: Request) -> Reply:
        if self.engine.get(req.ids["id"]) is None:
            raise ApiError(404, "no_such_instance", f"no instance {req.ids['id']}")
        return ok(self.engine.debug_view(req.ids["id"]))

    @route("POST", r"/sandbox/inject/(?P<id>\d+)", "inject", "sandbox")
    def inject(self, req: Request) -> Reply:
        body = req.body if isinstance(req.body, dict) else {}
        if body.get("action") == "ratelimit":
            return self.inject_global(req)
        return ok(
            {
                "success": True,
                "instance": self.engine.inject(
                    req.ids["id"], str(body.get("action")), body.get("arg")
                ),
            }
        )

    @route("POST", "/sandbox/inject", "inject_global", "sandbox")
    def inject_global(self, req: Request) -> Reply:
        body = req.body if isinstance(req.body, dict) else {}
        if body.get("action") == "refuse-ask":
            return self._refuse_ask(body.get("arg"))
        if body.get("action") != "ratelimit":
            raise ApiError(
                400,
                "invalid_args",
                "global actions: ratelimit SECONDS, refuse-ask ASK_ID (others need an instance id)",
            )
        try:
            seconds = float(body.get("arg"))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_args", "ratelimit takes a number of seconds") from exc
        self.limiter.block_for(seconds)
        return ok({"success": True, "blocked_for": seconds})

    def _refuse_ask(self, arg: Any) -> Reply:
        try:
            ask_id = int(arg)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_args", "refuse-ask takes an ask id") from exc
        self.engine.refuse_ask(ask_id)
        return ok({"success": True, "refused_ask": ask_id})

    @route("POST", "/sandbox/topup", "topup", "sandbox")
    def topup(self, req: Request) -> Reply:
        body = req.body if isinstance(req.body, dict) else {}
        account = self.store.row(
            "SELECT * FROM accounts WHERE api_key = ?", (str(body.get("api_key")),)
        )
        if account is None:
            raise ApiError(404, "not_found", "no account with that api_key")
        try:
            amount = float(body.get("amount"))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_args", "amount must be a number of dollars") from exc
        now = time.time()
        add_payment(self.store, account["id"], amount, now)
        return ok({"success": True, "credit": billing.credit(self.store, account["id"], now)})

    @route("GET", r"/sandbox/download/(?P<id>\d+)", "download", "sandbox", raw=True)
    def download(self, req: Request) -> None:
        try:
            nbytes = int(req.params.get("bytes", 0))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_args", "bytes must be an integer") from exc
        if not 0 <= nbytes <= 10**13:
            raise ApiError(400, "invalid_args", "bytes must be between 0 and 10 TB")
        traffic.download(req.handler, self.engine, req.ids["id"], nbytes)

    @route("PUT", r"/sandbox/upload/(?P<id>\d+)", "upload", "sandbox", raw=True)
    @route("POST", r"/sandbox/upload/(?P<id>\d+)", "upload", "sandbox", raw=True)
    def upload(self, req: Request) -> Reply:
        received = traffic.upload(req.handler, self.engine, req.ids["id"])
        if received is None:
            raise ApiError(404, "no_such_instance", f"no live instance {req.ids['id']}")
        return ok({"success": True, "received": received})

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


def _match(method: str, path: str) -> tuple[Route, dict[str, int]] | Reply:
    allowed = False
    for rt in ROUTES:
        m = rt.pattern.match(path)
        if m is None:
            continue
        if rt.method == method:
            return rt, {k: int(v) for k, v in m.groupdict().items()}
        allowed = True
    if allowed:
        return Reply(
            405,
            {
                "success": False,
                "error": "invalid_request",
                "msg": f"{method} not allowed on {path}",
            },
        )
    return Reply(404, {"success": False, "error": "not_found", "msg": f"no endpoint {path}"})


def _params(query: str) -> dict[str, Any]:
    """Query parameters, JSON-decoded where they are JSON (``docs/vast-api.md`` §1)."""
    params: dict[str, Any] = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        value = values[-1]
        if key in RAW_PARAMS:
            params[key] = value
            continue
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def _credential(handler: BaseHTTPRequestHandler, params: dict) -> str:
    auth = handler.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return str(params.get("api_key") or "")


def _body(handler: BaseHTTPRequestHandler) -> Any:
    raw = b"".join(traffic.read_body(handler))
    if len(raw) > MAX_BODY:
        raise ApiError(413, "invalid_request", "body too large")
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_args", "the body is not valid JSON") from exc


def _send(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
    if isinstance(reply.body, str):
        data, ctype = reply.body.encode(), "text/plain; charset=utf-8"
    else:
        # Exactly "application/json": the CLI rejects any other Content-Type on search.
        data, ctype = json.dumps(reply.body).encode(), "application/json"
    try:
        handler.send_response(reply.status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        for k, v in reply.headers.items():
            handler.send_header(k, v)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)
    except OSError:
        handler.close_connection = True


def _write_server_file(state_dir: Path, url: str) -> None:
    """``server.json`` tells scripts and tests where this run listens."""
    tmp = state_dir / "server.json.tmp"
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    tmp.replace(state_dir / "server.json")
