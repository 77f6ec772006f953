"""Vast's refusals as typed exceptions, and the mapping from an error answer to one of them.

Every error the client raises is a ``VastError`` and carries the API's ``status``, ``code`` and
``message``. This module sits at the bottom of the package (nothing here imports the rest), so
callers can catch these without pulling in the transport; ``server_wait_hint`` lives here
because ``error_for`` puts the server's wait hint on ``RateLimited``.
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


class VastError(Exception):
    """Base of every error this client raises; carries what the API said."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, body: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body

    def __str__(self) -> str:
        where = ", ".join(str(x) for x in (self.status, self.code) if x is not None)
        return f"{self.message} ({where})" if where else self.message


class OfferGone(VastError):
    """The offer was rented by someone else or withdrawn (`no_such_ask`, 404/410)."""


class AuthFailed(VastError):
    """The API key is missing, wrong or lacks the scope (401, a 403 naming the key or login,
    404 `auth_error`): every call of the account would fail the same way."""


class OfferRefused(VastError):
    """Vast refused to rent this one offer, not the account (create's 403, e.g. "Offer N is not
    your own", or a stale quote's `invalid_price`): the next offer may rent. ``offer_id`` is
    the ask Vast named (its ``ask_id``), else the one asked for."""

    def __init__(self, message: str, *, offer_id: int | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.offer_id = offer_id


class RateLimited(VastError):
    """429 after the retries ran out, or a wait longer than we accept, or the daily quota."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class InsufficientCredit(VastError):
    """The account cannot pay (`insufficient_credit`, `missing_billing`)."""


class ProviderError(VastError):
    """Any other refusal or malformed answer; `status` and `body` say what came back."""


class InstanceGone(ProviderError):
    """The instance does not exist (any more) (`no_such_instance`)."""


class ProviderUnreachable(ProviderError):
    """Vast could not be reached after the retries (no HTTP status)."""


class CreateOutcomeUnknown(VastError):
    """A create request may or may not have rented an instance (read timeout, 5xx).

    Never retry blindly: look for an instance with ``label`` later and adopt it.
    """

    def __init__(self, message: str, *, label: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.label = label


class BidMismatch(VastError):
    """The created instance's `is_bid` differs from what was asked (the "bid trap",
    docs/vast-api.md §3).

    The instance was destroyed when ``destroyed`` is true; otherwise it still runs and bills.
    """

    def __init__(self, message: str, *, instance_id: int, destroyed: bool, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.instance_id = instance_id
        self.destroyed = destroyed


_THRESHOLD = re.compile(r"threshold\s*=\s*(\d+(?:\.\d+)?)")
_BILLING = re.compile(r"billing|credit|balance|payment", re.IGNORECASE)
# A 403 about the key itself names it (or the login or scope it lacks): "This action requires
# login." (docs/vast-api.md §1). Create's 403 about one offer names the offer instead (vast-ai/docs
# create_instance.yaml: "error 403/3586: Offer 1234567 is not your own. Hosts can only rent
# their own machines.").
_NAMES_THE_KEY = re.compile(
    r"api[ _-]?key|user key|\bkey\b|log ?in|auth|token|scope|credential", re.IGNORECASE
)


def parse_error_body(text: str) -> tuple[str | None, str]:
    """Return ``(code, message)`` from an error body: JSON with msg/message/detail, or text.

    docs/vast-api.md §1: usually ``{success, error, msg}``; some endpoints send only ``msg``,
    ``message`` or ``detail``; 429s are often plain text.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None, text.strip()
    if not isinstance(data, dict):
        return None, text.strip()
    code = data.get("error") if isinstance(data.get("error"), str) else None
    message = data.get("msg") or data.get("message") or data.get("detail") or code or text
    return code, str(message).strip()


def _error_class(status: int, code: str | None, message: str = "") -> type[VastError]:
    # docs/vast-api.md §3: an ask that is gone answers 404 `no_such_ask` (the generated spec) or 404
    # `invalid_args` with "no_such_ask" in the message (the hand-written docs' example).
    if code == "no_such_ask" or (status in (404, 410) and "no_such_ask" in message):
        return OfferGone
    # docs/vast-api.md §1: a bad key is 401, 403 or 404-with-auth_error depending on the
    # endpoint; a 403 that does not name the key refuses something else (on create: that one
    # offer).
    if status == 401 or code == "auth_error" or (status == 403 and refuses_the_key(message)):
        return AuthFailed
    if status == 429 or code in ("rate_limit_exceeded", "search_quota_exceeded"):
        return RateLimited
    # docs/vast-api.md §3: create answers 400 `invalid_args` "for billing issues", start 400
    # `missing_billing`.
    if code in ("insufficient_credit", "missing_billing") or (
        status == 400 and code == "invalid_args" and _BILLING.search(message)
    ):
        return InsufficientCredit
    if code == "no_such_instance":
        return InstanceGone
    return ProviderError


def refuses_the_key(message: str) -> bool:
    """Whether a 403's MESSAGE is about the API key (or the login it stands for), not about
    what was asked for."""
    return bool(_NAMES_THE_KEY.search(message or ""))


def error_for(status: int, text: str, headers: Mapping[str, str] | None = None) -> VastError:
    """Turn an error answer (HTTP status and body text) into the matching typed exception."""
    code, message = parse_error_body(text)
    kind = _error_class(status, code, message)
    kwargs: dict[str, Any] = {"status": status, "code": code, "body": text[:2000]}
    if kind is RateLimited:
        kwargs["retry_after"] = server_wait_hint(headers or {}, text)
    return kind(message or f"HTTP {status}", **kwargs)


def server_wait_hint(headers: Mapping[str, str], text: str) -> float | None:
    """Seconds the server asked us to wait: `Retry-After`, else `threshold=<s>` in the body.

    docs/vast-api.md §1: Vast documents no Retry-After, but its plain-text 429 names the
    endpoint's minimum interval (`API requests too frequent: endpoint threshold=<s>`).
    """
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value:
        seconds = _retry_after_seconds(value.strip())
        if seconds is not None:
            return seconds
    match = _THRESHOLD.search(text or "")
    return float(match.group(1)) if match else None


def _retry_after_seconds(value: str) -> float | None:
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
