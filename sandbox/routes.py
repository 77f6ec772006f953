"""Which handler answers a request: a table of routes (method, path pattern, auth, handler),
matched in order; a path no route knows is a 404, a method its routes lack a 405.

Each module of endpoints keeps its own table (``vast_api.ROUTES``, ``sandbox_api.ROUTES``);
the server matches their concatenation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.messages import Reply, Request

if TYPE_CHECKING:
    from sandbox.server import App


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    name: str
    auth: str  # none | user | billing | sandbox
    fn: Callable[[App, Request], Reply | None]
    raw: bool = False  # the handler reads the body / writes the response itself


def route(
    table: list[Route], method: str, path: str, name: str, auth: str, raw: bool = False
) -> Callable:
    """Register the decorated handler in TABLE for METHOD on PATH (a regex, anchored)."""

    def register(fn: Callable) -> Callable:
        table.append(Route(method, re.compile(path + "$"), name, auth, fn, raw))
        return fn

    return register


def match(routes: list[Route], method: str, path: str) -> tuple[Route, dict[str, int]] | Reply:
    allowed = False
    for rt in routes:
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
