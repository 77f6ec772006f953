"""The supervisor's agent API over HTTPS (see PROTOCOL.md), and retry pacing.

Every reply is sorted into one of four outcomes, because each asks for a different reaction:
an answer, TokenDead (stop everything), Refused (log, carry on), BadPayload (our bug: log), or
Unavailable (back off and try again; training goes on meanwhile).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from agent import __version__

log = logging.getLogger("agent.client")

API_PREFIX = "/api/agent/"


class ApiError(Exception):
    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(f"{status or 'no reply'}: {detail}")
        self.status = status
        self.detail = detail


class TokenDead(ApiError):
    """401/410: the attempt is over or fenced; stop training and upload nothing more."""


class Refused(ApiError):
    """409: the supervisor refused a state change."""


class BadPayload(ApiError):
    """422 or another 4xx: the request itself is wrong (a bug on one side)."""


class Unavailable(ApiError):
    """No usable reply: connection error, timeout, 5xx, 408/429 or a reply that is not JSON."""


class SupervisorClient:
    """One per thread (httpx clients are not shared across threads here)."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + API_PREFIX,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"nomadgpu-agent/{__version__}",
            },
            timeout=httpx.Timeout(timeout_s, connect=10.0),
        )

    def call(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(name, json=body)
        except httpx.HTTPError as exc:
            raise Unavailable(None, f"{type(exc).__name__}: {exc}") from exc
        return _interpret(response)

    def close(self) -> None:
        self._http.close()


def _interpret(response: httpx.Response) -> dict[str, Any]:
    status = response.status_code
    try:
        data = response.json()
    except ValueError:
        data = None
    if 200 <= status < 300:
        if not isinstance(data, dict):
            raise Unavailable(status, "the reply is not a JSON object")
        return data
    detail = data.get("detail") if isinstance(data, dict) else None
    detail = str(detail if detail is not None else response.text[:300])
    if status in (401, 410):
        raise TokenDead(status, detail)
    if status == 409:
        raise Refused(status, detail)
    if status in (408, 429) or status >= 500:
        raise Unavailable(status, detail)
    raise BadPayload(status, detail)


class Stopper(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class SignalFlag:
    """A stop flag that a signal handler may set: a plain attribute, no lock.

    (A handler runs between two bytecodes of the main thread; if it set a threading.Event
    while the main thread held that Event's lock, it would deadlock.)
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def set(self, signum: int) -> None:
        self.signum = signum

    def is_set(self) -> bool:
        return self.signum is not None

    def wait(self, timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self.is_set() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))
        return self.is_set()


class Backoff:
    """Exponential delays with jitter: 1, 2, 4 ... CAP seconds (each ±20 %)."""

    def __init__(self, initial_s: float = 1.0, cap_s: float = 30.0) -> None:
        self.initial_s = initial_s
        self.cap_s = cap_s
        self.failures = 0

    def next_delay(self) -> float:
        base = min(self.cap_s, self.initial_s * 2**self.failures)
        self.failures += 1
        return base * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.failures = 0


def call_until_answered(
    client: SupervisorClient,
    name: str,
    body: Callable[[], dict[str, Any]] | dict[str, Any],
    *,
    stop: Stopper,
    cap_s: float = 30.0,
) -> dict[str, Any] | None:
    """Call NAME until it answers; Unavailable only backs off. None when STOP is set first.

    BODY may be a function, so each retry sends the state as it is then. TokenDead, Refused and
    BadPayload propagate to the caller.
    """
    backoff = Backoff(cap_s=cap_s)
    while not stop.is_set():
        try:
            return client.call(name, body() if callable(body) else body)
        except Unavailable as exc:
            delay = backoff.next_delay()
            log.warning("%s: supervisor unavailable (%s); retrying in %.0fs", name, exc, delay)
            stop.wait(delay)
    return None
