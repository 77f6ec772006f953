"""What a request carries in, and how a reply goes out, the way Vast's API does both.

Query parameters are JSON-decoded where they are JSON (structured ones arrive JSON-encoded then
URL-encoded); the key comes as ``Authorization: Bearer`` or ``?api_key=``; bodies are JSON; a
reply is JSON (``application/json`` exactly) unless its body is text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs

from sandbox import traffic
from sandbox.errors import ApiError

MAX_BODY = 16 * 1024 * 1024
RAW_PARAMS = {"api_key", "after_token", "owner"}  # strings even when they look like JSON


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


def ok(body: Any = None, status: int = 200) -> Reply:
    return Reply(status, {"success": True} if body is None else body)


def parse_params(query: str) -> dict[str, Any]:
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


def credential_of(handler: BaseHTTPRequestHandler, params: dict) -> str:
    auth = handler.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return str(params.get("api_key") or "")


def read_json_body(handler: BaseHTTPRequestHandler) -> Any:
    raw = b"".join(traffic.read_body(handler))
    if len(raw) > MAX_BODY:
        raise ApiError(413, "invalid_request", "body too large")
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_args", "the body is not valid JSON") from exc


def send(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
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
