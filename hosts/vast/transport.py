"""How the client talks HTTP: the retry policy and the httpx transport that applies it.

Transient failures (429/502/503/504 and network errors) are retried inside ``RetryTransport``
with exponential backoff and jitter, never shorter than the server's wait hint. Each request
carries a retry mode: ``RETRY_SAFE`` for reads and idempotent calls, ``RETRY_UNSENT_ONLY`` for a
create, which is resent only when it provably never reached Vast or was refused unprocessed
(429, then after at least ``RetryPolicy.create_penalty_s``). Kept apart from ``client`` so the
policy can be tested with a fake inner transport and no Vast.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from hosts.vast.errors import parse_error_body, server_wait_hint

logger = logging.getLogger(__name__)

RETRY_EXTENSION = "nomadgpu.retry"  # per-request retry mode, read by RetryTransport
RETRY_SAFE = "safe"  # idempotent or read-only: retry transient statuses and network errors
RETRY_UNSENT_ONLY = "unsent_only"  # create: retry only what provably never reached the server
RETRY_STATUSES = frozenset({429, 502, 503, 504})  # docs/vast-api.md §1: what the SDK retries
# Errors raised before a single byte of the request left: safe to resend even a create.
UNSENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Network trouble worth another try for safe calls (not, say, an unsupported URL scheme).
TRANSIENT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry. The defaults outlast Vast's 4.5 s create interval."""

    attempts: int = 5
    base_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 20.0
    jitter: float = 0.25  # up to +25 %, so several workers do not retry in lockstep
    # docs/vast-api.md §1: the SDK waits for Retry-After ≤ 60 s, else gives up
    max_server_wait: float = 60.0
    # Vast's create_instance spec gives `PUT /asks/{id}/` a 4.5 s threshold *and* `penalty: 12`
    # (vast-ai/docs create_instance.yaml): a create that met a 429 waits at least this long, so
    # a retry at the bare threshold does not run into the penalty again.
    create_penalty_s: float = 12.0


def retry_delay(attempt: int, hint: float | None, policy: RetryPolicy, rand: float) -> float:
    """Delay before retry number ``attempt`` (1-based): never shorter than the server's hint."""
    backoff = min(policy.max_delay, policy.base_delay * policy.multiplier ** (attempt - 1))
    base = max(hint, backoff) if hint is not None else backoff
    return base * (1 + policy.jitter * rand)


def is_quota_exhausted(text: str) -> bool:
    """A 429 for the daily search quota: retrying cannot help until UTC midnight
    (docs/vast-api.md §1)."""
    return parse_error_body(text)[0] == "search_quota_exceeded"


def may_retry_status(status: int, mode: str, text: str) -> bool:
    """Whether an HTTP answer is worth another attempt in this retry mode."""
    if status == 429:  # rejected unprocessed, so safe even for a create
        return not is_quota_exhausted(text)
    return mode == RETRY_SAFE and status in RETRY_STATUSES


def may_retry_error(exc: httpx.TransportError, mode: str) -> bool:
    """Whether a network error is worth another attempt in this retry mode."""
    if isinstance(exc, UNSENT_ERRORS):
        return True
    return mode == RETRY_SAFE and isinstance(exc, TRANSIENT_ERRORS)


class RetryTransport(httpx.BaseTransport):
    """Wraps a transport; retries transient failures per the request's retry mode."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._inner = inner
        self._policy = policy
        self._sleep = sleep
        self._rand = rand

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        mode = request.extensions.get(RETRY_EXTENSION, RETRY_SAFE)
        for attempt in range(1, self._policy.attempts):
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as exc:
                if not may_retry_error(exc, mode):
                    raise
                self._wait(attempt, None, request, repr(exc))
                continue
            hint = self._hint_if_retryable(response, mode)
            if hint is None:
                return response
            response.close()
            self._wait(attempt, hint or None, request, f"HTTP {response.status_code}")
        return self._inner.handle_request(request)  # the last attempt, whatever it brings

    def _hint_if_retryable(self, response: httpx.Response, mode: str) -> float | None:
        """None: hand the response back. Otherwise the server's wait hint (0.0 if none)."""
        if response.status_code not in RETRY_STATUSES:
            return None
        text = response.read().decode("utf-8", "replace")
        if not may_retry_status(response.status_code, mode, text):
            return None
        hint = server_wait_hint(response.headers, text)
        if hint is not None and hint > self._policy.max_server_wait:
            # docs/vast-api.md §1: a wait over 60 s means give up now, not sleep a minute.
            return None
        if mode == RETRY_UNSENT_ONLY and response.status_code == 429:
            return max(hint or 0.0, self._policy.create_penalty_s)
        return hint or 0.0

    def _wait(self, attempt: int, hint: float | None, request: httpx.Request, why: str) -> None:
        delay = retry_delay(attempt, hint, self._policy, self._rand())
        logger.info("vast %s %s: %s, retry in %.2fs", request.method, request.url.path, why, delay)
        self._sleep(delay)

    def close(self) -> None:
        self._inner.close()
