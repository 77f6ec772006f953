"""Vast's REST endpoints as the sandbox answers them (``docs/vast-api.md``): offer search,
instances (create, list, show, change, destroy, change bid, reboot), the account, charges and
invoices. Auth and rate limits come first, in ``server.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sandbox import billing, payments
from sandbox.errors import ApiError
from sandbox.messages import Reply, Request, ok
from sandbox.query import QueryError
from sandbox.routes import Route, route
from sandbox.views import instance_json, list_instances

if TYPE_CHECKING:
    from sandbox.server import App

ROUTES: list[Route] = []


# ---- offer search --------------------------------------------------------------------------


def _search(app: App, query: Any, select_cols: Any = None) -> Reply:
    if not isinstance(query, dict):
        raise QueryError("the query must be a JSON object")
    now = time.time()
    rented = app.engine.rented_asks()
    offers = app.market.search(
        query, rented, app.engine.gone_asks(), now, _min_bids(app, rented, now)
    )
    if isinstance(select_cols, list) and select_cols and select_cols != ["*"]:
        offers = [{c: o.get(c) for c in select_cols} for o in offers]
    return Reply(200, {"offers": offers})


def _min_bids(app: App, rented: set[int], now: float) -> Callable[[int], float]:
    """Each ask's min_bid now: the walk's, or the bid of a tenant holding the machine."""
    rivals = {
        r["ask_id"]: r["rival_bid"]
        for r in app.store.rows(
            "SELECT ask_id, rival_bid FROM instances"
            " WHERE destroyed_at IS NULL AND rival_bid IS NOT NULL"
        )
    }
    return lambda ask: max(app.bids.floor(ask, now), rivals.get(ask) or 0.0)


@route(ROUTES, "POST", "/api/v0/bundles", "bundles", "none")
def search_post(app: App, req: Request) -> Reply:
    return _search(app, req.body if req.body is not None else {})


@route(ROUTES, "GET", "/api/v0/bundles", "bundles", "none")
def search_get(app: App, req: Request) -> Reply:
    return _search(app, req.params.get("q", {}), req.params.get("select_cols"))


@route(ROUTES, "PUT", "/api/v0/search/asks", "search_asks", "none")
def search_put(app: App, req: Request) -> Reply:
    body = req.body or {}
    return _search(app, body.get("q", {}), body.get("select_cols"))


# ---- instances ---------------------------------------------------------------------------


def _owned(app: App, req: Request) -> dict:
    inst = app.engine.owned(req.account["id"], req.ids["id"])
    if inst is None:
        raise ApiError(
            404,
            "no_such_instance",
            f"error 404/3602: no_such_instance  Instance {req.ids['id']} not found.",
        )
    return inst


@route(ROUTES, "PUT", r"/api/v0/asks/(?P<id>\d+)", "ask", "user")
def create(app: App, req: Request) -> Reply:
    return ok(
        app.engine.create(
            req.account["id"], req.ids["id"], req.body if req.body is not None else {}
        )
    )


@route(ROUTES, "GET", "/api/v1/instances", "instances_v1", "user")
def list_v1(app: App, req: Request) -> Reply:
    return ok(list_instances(app.engine, req.account["id"], req.params, time.time()))


@route(ROUTES, "GET", "/api/v0/instances", "instances_v0", "user")
def list_v0(app: App, req: Request) -> Reply:
    # Accounts created after 2026-06-02 get 410 here; every sandbox account is new.
    raise ApiError(
        410,
        "deprecated",
        "GET /api/v0/instances/ is no longer available; use /api/v1/instances/.",
    )


@route(ROUTES, "GET", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
def show(app: App, req: Request) -> Reply:
    inst = app.engine.owned(req.account["id"], req.ids["id"])
    return ok({"instances": instance_json(app.engine, inst, time.time()) if inst else None})


@route(ROUTES, "PUT", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
def update(app: App, req: Request) -> Reply:
    inst, body = _owned(app, req), req.body if isinstance(req.body, dict) else {}
    if "state" in body:
        if body["state"] == "stopped":
            app.engine.stop(inst, renter=True)
            return ok()
        if body["state"] == "running":
            return ok(app.engine.start(inst))
        raise ApiError(400, "invalid_args", "state must be 'running' or 'stopped'")
    if "label" in body:
        app.engine.set_label(inst, body["label"])
        return ok()
    raise ApiError(400, "invalid_args", "nothing to change: send 'state' or 'label'")


@route(ROUTES, "DELETE", r"/api/v0/instances/(?P<id>\d+)", "instance", "user")
def destroy(app: App, req: Request) -> Reply:
    app.engine.destroy(_owned(app, req))
    return ok({"success": True, "msg": f"Instance {req.ids['id']} destroyed."})


@route(ROUTES, "PUT", r"/api/v0/instances/bid_price/(?P<id>\d+)", "bid_price", "user")
def change_bid(app: App, req: Request) -> Reply:
    inst = app.engine.owned(req.account["id"], req.ids["id"])
    if inst is None:  # the change-bid spec's own 404 (vast-ai/docs openapi.yaml)
        raise ApiError(404, "no_such_instance", "Instance with that ID does not exist.")
    return ok(app.engine.change_bid(inst, req.body if req.body is not None else {}))


@route(ROUTES, "PUT", r"/api/v0/instances/reboot/(?P<id>\d+)", "reboot", "user")
def reboot(app: App, req: Request) -> Reply:
    app.engine.reboot(_owned(app, req))
    return ok()


# ---- account and billing -----------------------------------------------------------------


@route(ROUTES, "GET", "/api/v0/users/current", "user", "user")
def user(app: App, req: Request) -> Reply:
    account = req.account
    return ok(
        {
            "id": account["id"],
            "email": account["email"],
            "username": f"user{account['id']}",
            "fullname": "Sandbox User",
            "credit": billing.credit(app.store, account["id"], time.time()),
            # Vast's `balance` (legacy unpaid-invoice total) has no meaning with prepaid credit.
            "balance": 0.0,
            "ssh_key": "",
            "has_billing": True,
            "created_at": account["created_at"],
        }
    )


@route(ROUTES, "GET", "/api/v0/charges", "charges", "billing")
def charges(app: App, req: Request) -> Reply:
    return ok(billing.charges(app.store, req.account["id"], req.params, time.time()))


@route(ROUTES, "GET", "/api/v1/invoices", "invoices_v1", "billing")
def invoices(app: App, req: Request) -> Reply:
    return ok(payments.invoices(app.store, req.account["id"], req.params, time.time()))
