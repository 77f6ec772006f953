"""Interruptible rentals on a sandbox over raw HTTP: offers priced for bids, renting one at a
price, and an instance as the sandbox shows it."""

from __future__ import annotations

from tests.support.sandbox import DEFAULT_KEY, Sandbox

SLEEP_ONSTART = "echo run >> runs\nexec sleep 120\n"


def bid_asks(box: Sandbox, count: int) -> list[dict]:
    """COUNT rentable offers priced for interruptible rental, cheapest floor first."""
    query = {"rentable": {"eq": True}, "type": "bid", "order": [["min_bid", "asc"]]}
    offers = [o for o in box.search({**query, "limit": 50}) if o["min_bid"] >= 0.05]
    assert len(offers) >= count
    return offers[:count]


def rent_bid(box: Sandbox, offer: dict, price: float, **body) -> int:
    body.setdefault("onstart", SLEEP_ONSTART)
    return box.create(offer["id"], price=round(price, 4), **body)


def shown(box: Sandbox, iid: int, key: str = DEFAULT_KEY) -> dict:
    return box.client(key).get(f"/api/v0/instances/{iid}/").json()["instances"]
