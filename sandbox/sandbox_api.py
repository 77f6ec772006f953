"""The sandbox-only endpoints, under ``/sandbox/`` and with no key (a local test bed): health,
the instances' sandbox-side state, the machines' hidden traits (market weather), failure
injection, top-ups, and the metered download and upload an instance's "transfers" go through.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sandbox import billing, traffic
from sandbox.engine.buyer_hazards import BUYER_HAZARDS
from sandbox.errors import ApiError
from sandbox.messages import Reply, Request, ok
from sandbox.routes import Route, route
from sandbox.state import add_payment

if TYPE_CHECKING:
    from sandbox.server import App

ROUTES: list[Route] = []


@route(ROUTES, "GET", "/sandbox/health", "health", "sandbox")
def health(app: App, req: Request) -> Reply:
    o = app.options
    return ok(
        {
            "ok": True,
            "url": app.engine.url,
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
            "market_weather": o.market_weather,
            "offers": len(app.market.offers),
        }
    )


@route(ROUTES, "GET", "/sandbox/instances", "sandbox_instances", "sandbox")
def sandbox_instances(app: App, req: Request) -> Reply:
    ids = [r["id"] for r in app.store.rows("SELECT id FROM instances ORDER BY id")]
    return ok({"instances": [app.engine.debug_view(i) for i in ids]})


@route(ROUTES, "GET", "/sandbox/machines", "sandbox_machines", "sandbox")
def sandbox_machines(app: App, req: Request) -> Reply:
    """Every machine's hidden traits in this market weather (``weather.py``): for an operator,
    never served through the Vast API."""
    return ok(app.engine.machines_view())


@route(ROUTES, "GET", r"/sandbox/instances/(?P<id>\d+)", "sandbox_instance", "sandbox")
def sandbox_instance(app: App, req: Request) -> Reply:
    if app.engine.get(req.ids["id"]) is None:
        raise ApiError(404, "no_such_instance", f"no instance {req.ids['id']}")
    return ok(app.engine.debug_view(req.ids["id"]))


@route(ROUTES, "POST", r"/sandbox/inject/(?P<id>\d+)", "inject", "sandbox")
def inject(app: App, req: Request) -> Reply:
    body = req.body if isinstance(req.body, dict) else {}
    if body.get("action") == "ratelimit":
        return inject_global(app, req)
    return ok(
        {
            "success": True,
            "instance": app.engine.inject(req.ids["id"], str(body.get("action")), body.get("arg")),
        }
    )


@route(ROUTES, "POST", "/sandbox/inject", "inject_global", "sandbox")
def inject_global(app: App, req: Request) -> Reply:
    body = req.body if isinstance(req.body, dict) else {}
    if body.get("action") == "refuse-ask":
        return _refuse_ask(app, body.get("arg"))
    if body.get("action") in BUYER_HAZARDS:
        return _arm_hazard(app, str(body["action"]), body.get("arg"))
    if body.get("action") != "ratelimit":
        raise ApiError(
            400,
            "invalid_args",
            "global actions: ratelimit SECONDS, refuse-ask ASK_ID, double-sell ASK_ID, "
            "create-timeout ASK_ID (others need an instance id)",
        )
    try:
        seconds = float(body.get("arg"))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "ratelimit takes a number of seconds") from exc
    app.limiter.block_for(seconds)
    return ok({"success": True, "blocked_for": seconds})


def _refuse_ask(app: App, arg: Any) -> Reply:
    try:
        ask_id = int(arg)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "refuse-ask takes an ask id") from exc
    app.engine.refuse_ask(ask_id)
    return ok({"success": True, "refused_ask": ask_id})


def _arm_hazard(app: App, kind: str, arg: Any) -> Reply:
    """The next create of the ask meets KIND (``engine/buyer_hazards.py``)."""
    try:
        ask_id = int(arg)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", f"{kind} takes an ask id") from exc
    armed = app.engine.arm_hazard(kind, ask_id)
    return ok({"success": True, "ask_id": ask_id, "hazard": kind, "armed": armed})


@route(ROUTES, "POST", "/sandbox/topup", "topup", "sandbox")
def topup(app: App, req: Request) -> Reply:
    body = req.body if isinstance(req.body, dict) else {}
    account = app.store.row("SELECT * FROM accounts WHERE api_key = ?", (str(body.get("api_key")),))
    if account is None:
        raise ApiError(404, "not_found", "no account with that api_key")
    try:
        amount = float(body.get("amount"))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "amount must be a number of dollars") from exc
    now = time.time()
    add_payment(app.store, account["id"], amount, now)
    return ok({"success": True, "credit": billing.credit(app.store, account["id"], now)})


@route(ROUTES, "GET", r"/sandbox/download/(?P<id>\d+)", "download", "sandbox", raw=True)
def download(app: App, req: Request) -> None:
    try:
        nbytes = int(req.params.get("bytes", 0))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "bytes must be an integer") from exc
    if not 0 <= nbytes <= 10**13:
        raise ApiError(400, "invalid_args", "bytes must be between 0 and 10 TB")
    traffic.download(req.handler, app.engine, req.ids["id"], nbytes)


@route(ROUTES, "PUT", r"/sandbox/upload/(?P<id>\d+)", "upload", "sandbox", raw=True)
@route(ROUTES, "POST", r"/sandbox/upload/(?P<id>\d+)", "upload", "sandbox", raw=True)
def upload(app: App, req: Request) -> Reply:
    received = traffic.upload(req.handler, app.engine, req.ids["id"])
    if received is None:
        raise ApiError(404, "no_such_instance", f"no live instance {req.ids['id']}")
    return ok({"success": True, "received": received})
