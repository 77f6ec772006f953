"""What NomadGPU sends: the bodies of search and create, and query parameters the SDK's way."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

BID_MIN_USD, BID_MAX_USD = 0.001, 128.0  # docs/vast-api.md §3: accepted `price` range
# A bid changed later may not go as high (vast-ai/docs openapi.yaml, change-bid: 0.001-32).
CHANGE_BID_MAX_USD = 32.0
# docs/vast-api.md §3: the SDK's spelling of "ssh, direct and proxied"; Vast runs `onstart` only
# in the ssh/jupyter launch modes (`args` keeps the image's entrypoint and ignores it).
DEFAULT_RUNTYPE = "ssh_direc ssh_proxy"
# docs/vast-api.md §2: the SDK's default order, and the conditions it adds unless no_default.
DEFAULT_ORDER: tuple[tuple[str, str], ...] = (("score", "desc"),)
SEARCH_DEFAULTS: Mapping[str, Mapping[str, bool]] = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
}


def build_search_body(
    query: Mapping[str, Any] | None,
    *,
    type: str = "on-demand",
    order: Iterable[Iterable[str]] | None = DEFAULT_ORDER,
    limit: int | None = None,
    allocated_storage: float | None = None,
    no_default: bool = False,
) -> dict[str, Any]:
    """The body of `POST /bundles/`: the query object itself plus the SDK's extras
    (docs/vast-api.md §2).

    A key whose condition is None is sent without any condition, not even the default: the
    CLI's ``any`` wildcard deletes the key (``vastai`` 1.9.1 ``api/query.py`` ``parse_query``);
    it never sends ``{"in": [true, false]}``, whose meaning on Vast is unknown."""
    body: dict[str, Any] = dict(query or {})
    if not no_default:
        for key, condition in SEARCH_DEFAULTS.items():
            body.setdefault(key, dict(condition))
    body = {key: condition for key, condition in body.items() if condition is not None}
    # docs/vast-api.md §2: the SDK maps the same.
    body["type"] = "bid" if type == "interruptible" else type
    if order is not None:
        body["order"] = [list(pair) for pair in order]
    if limit is not None:
        body["limit"] = limit
    if allocated_storage is not None:
        body["allocated_storage"] = allocated_storage
    return body


def build_create_body(
    *,
    image: str,
    disk_gb: float,
    label: str,
    onstart: str,
    env: Mapping[str, str] | None,
    runtype: str,
    bid_usd_per_hour: float | None,
    image_login: str | None = None,
) -> dict[str, Any]:
    """The body of `PUT /asks/{id}/` (docs/vast-api.md §3). A bid price is what makes it
    interruptible; IMAGE_LOGIN (docker login arguments, "-u USER -p TOKEN ghcr.io") lets the host
    pull a private image, and is sent only when given."""
    body: dict[str, Any] = {
        "client_id": "me",
        "image": image,
        "disk": disk_gb,
        "label": label,
        "onstart": onstart,
        "env": dict(env or {}),  # docs/vast-api.md §3: a JSON object, as the SDK sends it
        "runtype": runtype,
    }
    if bid_usd_per_hour is not None:
        if not BID_MIN_USD <= bid_usd_per_hour <= BID_MAX_USD:
            raise ValueError(f"bid {bid_usd_per_hour} $/h is outside Vast's range 0.001 to 128")
        body["price"] = bid_usd_per_hour
    if image_login:
        body["image_login"] = image_login
    return body


def encode_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters the SDK's way: strings as-is, everything else as JSON
    (docs/vast-api.md §1)."""
    return {
        k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items() if v is not None
    }
