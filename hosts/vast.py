"""The Vast.ai REST client: the only code in NomadGPU that talks to Vast (or the sandbox).

A small httpx client; the official ``vastai`` package is not a dependency. Every quirk handled
here cites the shared reference ``shared/vast-api.md`` as "ref §N".

Units: one convention for everything this module returns, whatever Vast sent.

=====================  ==============================================================
quantity               unit in NomadGPU (Vast field → conversion)
=====================  ==============================================================
compute price          USD per hour, float (``dph_base``, ``dph_total``, ``min_bid``, bids)
storage price          USD per GB per hour, float (``storage_cost`` is $/GB/month; ÷ 720,
                       Vast's 30-day month, ref §2 and §7)
traffic price          USD per GB, float (``inet_down_cost``/``inet_up_cost``; when only
                       ``internet_*_cost_per_tb`` is present: ÷ 1024, ref §2)
bandwidth              Mbit/s (``inet_down``/``inet_up``; the CLI/UI reading, ref §2 conflict)
memory                 GB, meaning GiB: Vast's RAM "MB" fields are MiB, ÷ 1024
disk                   GB as Vast sends it (``disk_space``)
time                   aware UTC ``datetime`` (Vast sends epoch seconds)
ledger amounts         ``Decimal`` USD as Vast rounds them (charges, invoices)
=====================  ==============================================================

Missing or null fields become ``None`` (never a guessed zero), except ledger amounts (``0``).

Errors are typed (all subclasses of ``VastError``) and carry the API's ``status``, ``code`` and
``message``. Transient failures (429/502/503/504 and network errors) are retried inside
``RetryTransport`` with exponential backoff and jitter; ``create_instance`` is never retried
unless the request provably did not reach Vast (see ``create_instance``).
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import httpx

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://console.vast.ai"
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=60.0, write=30.0, pool=10.0)
HOURS_PER_STORAGE_MONTH = 720  # ref §2: storage_total_cost = storage_cost * GB / 720
MIB_PER_GIB = 1024
GB_PER_TB = 1024  # ref §2 / market README: $/TB prices ÷ 1024 give the $/GB field
BID_MIN_USD, BID_MAX_USD = 0.001, 128.0  # ref §3: accepted `price` range
# ref §3: the SDK's spelling of "ssh, direct and proxied"; Vast runs `onstart` only in the
# ssh/jupyter launch modes (`args` keeps the image's entrypoint and ignores it).
DEFAULT_RUNTYPE = "ssh_direc ssh_proxy"
DEFAULT_ORDER: tuple[tuple[str, str], ...] = (("score", "desc"),)  # ref §2: SDK default order
SEARCH_DEFAULTS: Mapping[str, Mapping[str, bool]] = {  # ref §2: added by the SDK unless no_default
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
}


# --- Errors -------------------------------------------------------------------------------


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
    """The API key is missing, wrong or lacks the scope (401, 403, 404 `auth_error`)."""


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
    """The created instance's `is_bid` differs from what was asked (the "bid trap", ref §3).

    The instance was destroyed when ``destroyed`` is true; otherwise it still runs and bills.
    """

    def __init__(self, message: str, *, instance_id: int, destroyed: bool, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.instance_id = instance_id
        self.destroyed = destroyed


_THRESHOLD = re.compile(r"threshold\s*=\s*(\d+(?:\.\d+)?)")
_BILLING = re.compile(r"billing|credit|balance|payment", re.IGNORECASE)


def parse_error_body(text: str) -> tuple[str | None, str]:
    """Return ``(code, message)`` from an error body: JSON with msg/message/detail, or text.

    ref §1: usually ``{success, error, msg}``; some endpoints send only ``msg``, ``message`` or
    ``detail``; 429s are often plain text.
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
    # ref §3: an ask that is gone answers 404 `no_such_ask` (the generated spec) or 404
    # `invalid_args` with "no_such_ask" in the message (the hand-written docs' example).
    if code == "no_such_ask" or (status in (404, 410) and "no_such_ask" in message):
        return OfferGone
    # ref §1: a bad key is 401, 403 or 404-with-auth_error depending on the endpoint.
    if status in (401, 403) or code == "auth_error":
        return AuthFailed
    if status == 429 or code in ("rate_limit_exceeded", "search_quota_exceeded"):
        return RateLimited
    # ref §3: create answers 400 `invalid_args` "for billing issues", start 400 `missing_billing`.
    if code in ("insufficient_credit", "missing_billing") or (
        status == 400 and code == "invalid_args" and _BILLING.search(message)
    ):
        return InsufficientCredit
    if code == "no_such_instance":
        return InstanceGone
    return ProviderError


def error_for(status: int, text: str, headers: Mapping[str, str] | None = None) -> VastError:
    """Turn an error answer (HTTP status and body text) into the matching typed exception."""
    code, message = parse_error_body(text)
    kind = _error_class(status, code, message)
    kwargs: dict[str, Any] = {"status": status, "code": code, "body": text[:2000]}
    if kind is RateLimited:
        kwargs["retry_after"] = server_wait_hint(headers or {}, text)
    return kind(message or f"HTTP {status}", **kwargs)


# --- Retries --------------------------------------------------------------------------------

RETRY_EXTENSION = "nomadgpu.retry"  # per-request retry mode, read by RetryTransport
RETRY_SAFE = "safe"  # idempotent or read-only: retry transient statuses and network errors
RETRY_UNSENT_ONLY = "unsent_only"  # create: retry only what provably never reached the server
RETRY_STATUSES = frozenset({429, 502, 503, 504})  # ref §1: what the SDK retries
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
    max_server_wait: float = 60.0  # ref §1: the SDK waits for Retry-After ≤ 60 s, else gives up
    # Vast's create_instance spec gives `PUT /asks/{id}/` a 4.5 s threshold *and* `penalty: 12`
    # (vast-ai/docs create_instance.yaml): a create that met a 429 waits at least this long, so
    # a retry at the bare threshold does not run into the penalty again.
    create_penalty_s: float = 12.0


def server_wait_hint(headers: Mapping[str, str], text: str) -> float | None:
    """Seconds the server asked us to wait: `Retry-After`, else `threshold=<s>` in the body.

    ref §1: Vast documents no Retry-After, but its plain-text 429 names the endpoint's minimum
    interval (`API requests too frequent: endpoint threshold=<s>`).
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


def retry_delay(attempt: int, hint: float | None, policy: RetryPolicy, rand: float) -> float:
    """Delay before retry number ``attempt`` (1-based): never shorter than the server's hint."""
    backoff = min(policy.max_delay, policy.base_delay * policy.multiplier ** (attempt - 1))
    base = max(hint, backoff) if hint is not None else backoff
    return base * (1 + policy.jitter * rand)


def is_quota_exhausted(text: str) -> bool:
    """A 429 for the daily search quota: retrying cannot help until UTC midnight (ref §1)."""
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
            return None  # ref §1: a wait over 60 s means give up now, not sleep a minute
        if mode == RETRY_UNSENT_ONLY and response.status_code == 429:
            return max(hint or 0.0, self._policy.create_penalty_s)
        return hint or 0.0

    def _wait(self, attempt: int, hint: float | None, request: httpx.Request, why: str) -> None:
        delay = retry_delay(attempt, hint, self._policy, self._rand())
        logger.info("vast %s %s: %s, retry in %.2fs", request.method, request.url.path, why, delay)
        self._sleep(delay)

    def close(self) -> None:
        self._inner.close()


# --- Typed results ----------------------------------------------------------------------------


def _mapping_field() -> Any:
    """A dict attribute of a frozen result: kept out of repr, equality and hashing."""
    return field(default_factory=dict, repr=False, compare=False, hash=False)


@dataclass(frozen=True)
class Offer:
    """One rentable offer (`POST /bundles/`), in NomadGPU units (module docstring)."""

    id: int
    machine_id: int | None
    host_id: int | None
    gpu_name: str
    num_gpus: int
    gpu_ram_gb: float | None
    gpu_total_ram_gb: float | None
    cpu_cores_effective: float | None
    cpu_ram_gb: float | None
    disk_space_gb: float | None
    cuda_max_good: float | None
    compute_cap: int | None
    dph_base: float | None
    dph_total: float | None
    min_bid: float | None
    storage_usd_per_gb_hour: float | None
    download_usd_per_gb: float | None
    upload_usd_per_gb: float | None
    inet_down_mbps: float | None
    inet_up_mbps: float | None
    reliability: float | None
    verified: bool
    datacenter: bool
    dlperf: float | None
    geolocation: str | None
    # Seconds the host's contract still runs (`duration`, ref §2: "seconds from now → end_date"):
    # an on-demand instance is stopped at its end_date and cannot be restarted.
    duration_s: float | None = None
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class Instance:
    """One rented instance (v1 list or show-one), in NomadGPU units."""

    id: int
    label: str | None
    actual_status: str | None
    intended_status: str | None
    cur_state: str | None
    next_state: str | None
    status_msg: str | None
    machine_id: int | None
    host_id: int | None
    gpu_name: str | None
    num_gpus: int | None
    is_bid: bool | None
    dph_base: float | None
    dph_total: float | None
    min_bid: float | None
    storage_usd_per_gb_hour: float | None
    download_usd_per_gb: float | None
    upload_usd_per_gb: float | None
    disk_space_gb: float | None
    start_date: datetime | None
    end_date: datetime | None
    image: str | None
    public_ipaddr: str | None
    env: Mapping[str, str] = _mapping_field()
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class CreatedInstance:
    """What a successful create returned, plus the bid check (`is_bid` None: not verified)."""

    id: int
    instance_api_key: str | None
    created_stopped: bool
    is_bid: bool | None
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class StateChange:
    """Answer to stop/start. `queued`: Vast accepted it but waits for the GPU (ref §5)."""

    instance_id: int
    state: str
    queued: bool
    message: str


@dataclass(frozen=True)
class ChargeItem:
    """One category of a charge (`gpu`, `disk`, `bwd`, `bwu`).

    Vast gives quantity and rate only inside `description` (ref §6a); they are None when the
    wording is not recognised. `rate` is USD per `rate_unit` (e.g. "hour", "GB", "GB-hour").
    """

    type: str | None
    amount: Decimal
    description: str
    quantity: Decimal | None
    unit: str | None
    rate: Decimal | None
    rate_unit: str | None


@dataclass(frozen=True)
class Charge:
    """One contract's charges in the window (`GET /api/v0/charges/`, ref §6a)."""

    source: str | None
    instance_id: int | None
    label: str | None
    type: str | None
    start: datetime | None
    end: datetime | None
    amount: Decimal
    description: str
    items: tuple[ChargeItem, ...]
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class InvoiceRow:
    """A payment or credit (`GET /api/v1/invoices/`, ref §6b).

    Sign: ``amount`` is positive for money paid into the account (a top-up) and negative for
    money leaving it. Vast's raw JSON has it the other way round for every type except
    `transfer`/`payout` (its $25 top-up is -25.0); we flip those like the CLI does for display.
    ``raw_amount`` keeps Vast's number.
    """

    invoice_id: str | None
    type: str | None
    service: str | None
    source: str | None
    description: str
    created_at: datetime | None
    paid_at: datetime | None
    amount: Decimal
    raw_amount: Decimal
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class VastUser:
    """The account behind the key (`GET /users/current`). `credit` is the spendable USD."""

    id: int | None
    email: str | None
    username: str | None
    credit: float | None
    balance: float | None
    raw: Mapping[str, Any] = _mapping_field()


@dataclass(frozen=True)
class InstancePresence:
    """Whether a requested instance still exists, and its status when it does."""

    id: int
    gone: bool
    instance: Instance | None

    @property
    def actual_status(self) -> str | None:
        return self.instance.actual_status if self.instance else None


# --- Parsing helpers ----------------------------------------------------------------------------


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def _int(value: Any) -> int | None:
    number = _float(value)
    return int(number) if number is not None else None


def _str(value: Any) -> str | None:
    return str(value) if value is not None else None


def _bool(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _decimal(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        result = Decimal(str(value).replace(",", ""))
    except InvalidOperation:
        return None
    return result if result.is_finite() else None


def _per(value: Any, divisor: float) -> float | None:
    number = _float(value)
    return number / divisor if number is not None else None


def utc_from_epoch(value: Any) -> datetime | None:
    """Epoch seconds (number or numeric string) → aware UTC datetime; junk → None."""
    seconds = _float(value)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def epoch_seconds(moment: datetime) -> int:
    """Aware datetime → whole epoch seconds (naive datetimes are refused: which zone?)."""
    if moment.tzinfo is None:
        raise ValueError("Vast windows need aware datetimes (UTC)")
    return int(moment.timestamp())


def _traffic_usd_per_gb(raw: Mapping[str, Any], direction: str) -> float | None:
    # ref §2: `inet_*_cost` is $/GB; some answers carry only `internet_*_cost_per_tb`.
    per_gb = _float(raw.get(f"inet_{direction}_cost"))
    if per_gb is not None:
        return per_gb
    return _per(raw.get(f"internet_{direction}_cost_per_tb"), GB_PER_TB)


def _dph_total(raw: Mapping[str, Any]) -> float | None:
    # ref §2: dph_total = dph_base + storage_total_cost; fill it in only when both parts are known.
    total = _float(raw.get("dph_total"))
    if total is not None:
        return total
    base, storage = _float(raw.get("dph_base")), _float(raw.get("storage_total_cost"))
    return base + storage if base is not None and storage is not None else None


def _gpu_total_ram_gb(raw: Mapping[str, Any]) -> float | None:
    total = _per(raw.get("gpu_total_ram"), MIB_PER_GIB)
    if total is not None:
        return total
    per_gpu, count = _per(raw.get("gpu_ram"), MIB_PER_GIB), _int(raw.get("num_gpus"))
    return per_gpu * count if per_gpu is not None and count is not None else None


def _verified(raw: Mapping[str, Any]) -> bool:
    if raw.get("verified") is not None:
        return bool(_bool(raw.get("verified")))
    return raw.get("verification") == "verified"


def _datacenter(raw: Mapping[str, Any]) -> bool:
    # ref §2: the SDK derives `datacenter` from `hosting_type == 1` client-side.
    if raw.get("datacenter") is not None:
        return bool(_bool(raw.get("datacenter")))
    return _int(raw.get("hosting_type")) == 1


def parse_offer(raw: Mapping[str, Any]) -> Offer:
    """One offer object from `POST /bundles/` → `Offer`."""
    return Offer(
        id=_int(raw.get("id")) or 0,
        machine_id=_int(raw.get("machine_id")),
        host_id=_int(raw.get("host_id")),
        gpu_name=str(raw.get("gpu_name") or ""),
        num_gpus=_int(raw.get("num_gpus")) or 0,
        gpu_ram_gb=_per(raw.get("gpu_ram"), MIB_PER_GIB),
        gpu_total_ram_gb=_gpu_total_ram_gb(raw),
        cpu_cores_effective=_float(raw.get("cpu_cores_effective")),
        cpu_ram_gb=_per(raw.get("cpu_ram"), MIB_PER_GIB),
        disk_space_gb=_float(raw.get("disk_space")),
        cuda_max_good=_float(raw.get("cuda_max_good")),
        compute_cap=_int(raw.get("compute_cap")),
        **_prices(raw),
        inet_down_mbps=_float(raw.get("inet_down")),
        inet_up_mbps=_float(raw.get("inet_up")),
        reliability=_float(_first(raw, "reliability", "reliability2")),
        verified=_verified(raw),
        datacenter=_datacenter(raw),
        dlperf=_float(raw.get("dlperf")),
        geolocation=_str(raw.get("geolocation")),
        duration_s=_float(raw.get("duration")),
        raw=dict(raw),
    )


def _prices(raw: Mapping[str, Any]) -> dict[str, float | None]:
    """The price fields offers and instances share, in NomadGPU units."""
    return {
        "dph_base": _float(raw.get("dph_base")),
        "dph_total": _dph_total(raw),
        "min_bid": _float(raw.get("min_bid")),
        "storage_usd_per_gb_hour": _per(raw.get("storage_cost"), HOURS_PER_STORAGE_MONTH),
        "download_usd_per_gb": _traffic_usd_per_gb(raw, "down"),
        "upload_usd_per_gb": _traffic_usd_per_gb(raw, "up"),
    }


def _first(raw: Mapping[str, Any], *keys: str) -> Any:
    return next((raw[k] for k in keys if raw.get(k) is not None), None)


def _env_dict(extra_env: Any) -> dict[str, str]:
    # ref §4: `extra_env` is a list of [key, value] pairs (the SDK turns it into a dict).
    if isinstance(extra_env, Mapping):
        return {str(k): str(v) for k, v in extra_env.items()}
    pairs = extra_env if isinstance(extra_env, list) else []
    return {str(p[0]): str(p[1]) for p in pairs if isinstance(p, list | tuple) and len(p) == 2}


def parse_instance(raw: Mapping[str, Any]) -> Instance:
    """One instance object (v1 list or show-one) → `Instance`."""
    return Instance(
        id=_int(raw.get("id")) or 0,
        label=_str(raw.get("label")),
        actual_status=_str(raw.get("actual_status")),
        intended_status=_str(raw.get("intended_status")),
        cur_state=_str(raw.get("cur_state")),
        next_state=_str(raw.get("next_state")),
        status_msg=_str(raw.get("status_msg")),
        machine_id=_int(raw.get("machine_id")),
        host_id=_int(raw.get("host_id")),
        gpu_name=_str(raw.get("gpu_name")),
        num_gpus=_int(raw.get("num_gpus")),
        is_bid=_bool(raw.get("is_bid")),
        **_prices(raw),
        disk_space_gb=_float(raw.get("disk_space")),
        start_date=utc_from_epoch(raw.get("start_date")),
        end_date=utc_from_epoch(raw.get("end_date")),
        image=_str(_first(raw, "image_uuid", "image")),
        public_ipaddr=_str(raw.get("public_ipaddr")),
        env=_env_dict(raw.get("extra_env")),
        raw=dict(raw),
    )


def instance_from_show(body: Any) -> Instance | None:
    """Show-one answer → `Instance`, or None when Vast says `{"instances": null}` (ref §4).

    The key is plural but holds one object; tolerate a one-element list too.
    """
    found = body.get("instances") if isinstance(body, Mapping) else None
    if isinstance(found, list):
        found = found[0] if found else None
    return parse_instance(found) if isinstance(found, Mapping) else None


_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# ref §6a: "96.000 hours at $0.389/hour"; also "12.3 GB downloaded at $0.0005/GB".
_QUANTITY_AT_RATE = re.compile(
    rf"^\s*(?P<quantity>{_NUMBER})\s*(?P<unit>[A-Za-z][\w-]*)(?:\s+[A-Za-z]+)*?"
    rf"\s+at\s+\$\s?(?P<rate>{_NUMBER})\s*(?:/|per\s+)\s*(?P<rate_unit>[\w/-]+)",
    re.IGNORECASE,
)
# Storage quoted per month: "10.0 GB for 2.500 hours at $0.150/GB/month" (the sandbox's wording;
# Vast's own is undocumented, ref §6a). Read in our units: GB-hours at $/GB-hour (÷ 720).
_STORAGE_AT_MONTHLY_RATE = re.compile(
    rf"^\s*(?P<gb>{_NUMBER})\s*GB\s+for\s+(?P<hours>{_NUMBER})\s*hours?"
    rf"\s+at\s+\$\s?(?P<rate>{_NUMBER})\s*/\s*GB\s*/\s*month",
    re.IGNORECASE,
)
_INSTANCE_SOURCE = re.compile(r"^instance-(\d+)$")


def quantity_and_rate(description: str) -> tuple[Decimal, str, Decimal, str] | None:
    """``(quantity, unit, rate, rate_unit)`` from a charge item's text; None if unrecognised."""
    if match := _STORAGE_AT_MONTHLY_RATE.match(description):
        gb_hours = _num(match["gb"]) * _num(match["hours"])
        return gb_hours, "GB-hours", _num(match["rate"]) / HOURS_PER_STORAGE_MONTH, "GB-hour"
    if match := _QUANTITY_AT_RATE.match(description):
        return _num(match["quantity"]), match["unit"], _num(match["rate"]), match["rate_unit"]
    return None


def _num(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def parse_charge_item(raw: Mapping[str, Any]) -> ChargeItem:
    """One entry of a charge's `items` → `ChargeItem` (quantity/rate only if the text says)."""
    description = str(raw.get("description") or "")
    quantity, unit, rate, rate_unit = quantity_and_rate(description) or (None, None, None, None)
    return ChargeItem(
        type=_str(raw.get("type")),
        amount=_decimal(raw.get("amount")) or Decimal(0),
        description=description,
        quantity=quantity,
        unit=unit,
        rate=rate,
        rate_unit=rate_unit,
    )


def parse_charge(raw: Mapping[str, Any]) -> Charge:
    """One contract row of `GET /api/v0/charges/` → `Charge`."""
    source = _str(raw.get("source"))
    match = _INSTANCE_SOURCE.match(source or "")
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    items = raw.get("items") if isinstance(raw.get("items"), list) else []
    return Charge(
        source=source,
        instance_id=int(match.group(1)) if match else None,
        label=_str(metadata.get("label")),
        type=_str(raw.get("type")),
        start=utc_from_epoch(raw.get("start")),
        end=utc_from_epoch(raw.get("end")),
        amount=_decimal(raw.get("amount")) or Decimal(0),
        description=str(raw.get("description") or ""),
        items=tuple(parse_charge_item(i) for i in items if isinstance(i, Mapping)),
        raw=dict(raw),
    )


# ref §6b: the CLI shows these types with Vast's sign, and flips every other type.
_INVOICE_TYPES_KEEPING_SIGN = frozenset({"transfer", "payout"})


def parse_invoice_row(raw: Mapping[str, Any]) -> InvoiceRow:
    """One row of `GET /api/v1/invoices/` → `InvoiceRow` (sign convention: see the class)."""
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    row_type = _str(raw.get("type"))
    raw_amount = _decimal(raw.get("amount")) or Decimal(0)
    keeps_sign = row_type in _INVOICE_TYPES_KEEPING_SIGN
    return InvoiceRow(
        invoice_id=_str(metadata.get("invoice_id")),
        type=row_type,
        service=_str(metadata.get("service")),
        source=_str(raw.get("source")),
        description=str(raw.get("description") or ""),
        created_at=utc_from_epoch(raw.get("start")),
        paid_at=utc_from_epoch(raw.get("end")),
        amount=raw_amount if keeps_sign else -raw_amount,
        raw_amount=raw_amount,
        raw=dict(raw),
    )


def parse_user(raw: Mapping[str, Any]) -> VastUser:
    """`GET /users/current` → `VastUser`."""
    return VastUser(
        id=_int(raw.get("id")),
        email=_str(raw.get("email")),
        username=_str(raw.get("username")),
        credit=_float(raw.get("credit")),
        balance=_float(raw.get("balance")),
        raw=dict(raw),
    )


# --- Pure decisions -------------------------------------------------------------------------


def instance_presence(
    ids: Iterable[int], listed: Iterable[Instance]
) -> dict[int, InstancePresence]:
    """Decide, for each requested id, whether the instance is present or gone.

    Gone: absent from the complete instance list, or released (`cur_state == "unloaded"`,
    which ref §4 documents as what destroy leaves behind).
    """
    by_id = {i.id: i for i in listed}
    result = {}
    for instance_id in ids:
        found = by_id.get(instance_id)
        gone = found is None or found.cur_state == "unloaded"
        result[instance_id] = InstancePresence(instance_id, gone, None if gone else found)
    return result


def build_search_body(
    query: Mapping[str, Any] | None,
    *,
    type: str = "on-demand",
    order: Iterable[Iterable[str]] | None = DEFAULT_ORDER,
    limit: int | None = None,
    allocated_storage: float | None = None,
    no_default: bool = False,
) -> dict[str, Any]:
    """The body of `POST /bundles/`: the query object itself plus the SDK's extras (ref §2).

    A key whose condition is None is sent without any condition, not even the default: the
    CLI's ``any`` wildcard deletes the key (``vastai`` 1.9.1 ``api/query.py`` ``parse_query``);
    it never sends ``{"in": [true, false]}``, whose meaning on Vast is unknown."""
    body: dict[str, Any] = dict(query or {})
    if not no_default:
        for key, condition in SEARCH_DEFAULTS.items():
            body.setdefault(key, dict(condition))
    body = {key: condition for key, condition in body.items() if condition is not None}
    body["type"] = "bid" if type == "interruptible" else type  # ref §2: the SDK maps the same
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
) -> dict[str, Any]:
    """The body of `PUT /asks/{id}/` (ref §3). A bid price is what makes it interruptible."""
    body: dict[str, Any] = {
        "client_id": "me",
        "image": image,
        "disk": disk_gb,
        "label": label,
        "onstart": onstart,
        "env": dict(env or {}),  # ref §3: a JSON object, as the SDK sends it
        "runtype": runtype,
    }
    if bid_usd_per_hour is not None:
        if not BID_MIN_USD <= bid_usd_per_hour <= BID_MAX_USD:
            raise ValueError(f"bid {bid_usd_per_hour} $/h is outside Vast's range 0.001 to 128")
        body["price"] = bid_usd_per_hour
    return body


def encode_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters the SDK's way: strings as-is, everything else as JSON (ref §1)."""
    return {
        k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items() if v is not None
    }


# --- The client -----------------------------------------------------------------------------


class VastClient:
    """Talks to Vast (or the sandbox). No Django needed; see `from_settings` for the factory."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_URL,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        retrying = RetryTransport(
            transport or httpx.HTTPTransport(), retry or RetryPolicy(), sleep=sleep, rand=rand
        )
        # Redirects are not followed: httpx would turn a redirected PUT into a GET.
        # trust_env=False: an environment proxy would get its own transport and bypass the
        # retries; pass transport=httpx.HTTPTransport(proxy=...) to use one.
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            transport=retrying,
            timeout=timeout,
            trust_env=False,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": "nomadgpu-vast/1",
            },
        )

    @property
    def base_url(self) -> str:
        """Where this client sends its calls."""
        return str(self._http.base_url).rstrip("/")

    @classmethod
    def from_settings(cls, team: Any = None, **kwargs: Any) -> VastClient:
        """A client for ``team``'s Vast account, else the server's `VAST_URL`/`VAST_API_KEY`."""
        from django.conf import settings  # here, so that the client itself needs no Django

        url = getattr(team, "vast_url", "") or settings.VAST_URL
        key = getattr(team, "vast_api_key", "") or settings.VAST_API_KEY
        return cls(key, url, **kwargs)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> VastClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- transport -----------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        retry: str = RETRY_SAFE,
    ) -> Any:
        if body is None and method != "GET":
            body = {}  # ref §1: the SDK sends {} when it has nothing else to send
        request = self._http.build_request(
            method,
            path,
            params=encode_params(params) if params else None,
            json=body,
            extensions={RETRY_EXTENSION: retry},
        )
        try:
            response = self._http.send(request)
        except httpx.TransportError as exc:
            if retry == RETRY_UNSENT_ONLY and not isinstance(exc, UNSENT_ERRORS):
                raise  # create_instance turns this into CreateOutcomeUnknown
            raise ProviderUnreachable(f"{method} {path}: {exc!r}") from exc
        return _decode(response)

    def _pages(self, path: str, params: Mapping[str, Any], key: str) -> Iterator[Mapping]:
        """Every row of a keyset-paginated list (`next_token` → `after_token`, ref §4/§6)."""
        token, seen = None, set()
        while True:
            page = dict(params) if token is None else {**params, "after_token": token}
            body = _require_success(self._request("GET", path, params=page))
            yield from (row for row in body.get(key) or [] if isinstance(row, Mapping))
            token = body.get("next_token")
            if not token:
                return
            if token in seen:
                raise ProviderError(f"{path}: next_token {token!r} repeats", body=str(body)[:2000])
            seen.add(token)

    # --- offers and rentals --------------------------------------------------------------

    def search_offers(
        self,
        query: Mapping[str, Any] | None = None,
        *,
        type: str = "on-demand",
        order: Iterable[Iterable[str]] | None = DEFAULT_ORDER,
        limit: int | None = None,
        allocated_storage: float | None = None,
        no_default: bool = False,
    ) -> list[Offer]:
        """Search the market (`POST /api/v0/bundles/`, ref §2).

        ``query`` uses Vast's language, e.g. ``{"gpu_name": {"eq": "RTX 4090"}}``; ``type`` is
        "on-demand", "bid" or "interruptible". Unless ``no_default``, only verified, rentable,
        unrented, non-external offers come back (the SDK's defaults; the query may override).
        """
        body = build_search_body(
            query,
            type=type,
            order=order,
            limit=limit,
            allocated_storage=allocated_storage,
            no_default=no_default,
        )
        data = self._request("POST", "/api/v0/bundles/", body=body)
        offers = data.get("offers") if isinstance(data, Mapping) else None
        return [parse_offer(o) for o in offers or [] if isinstance(o, Mapping)]

    def create_instance(
        self,
        offer_id: int,
        *,
        image: str,
        disk_gb: float,
        label: str,
        onstart: str = "",
        env: Mapping[str, str] | None = None,
        runtype: str = DEFAULT_RUNTYPE,
        bid_usd_per_hour: float | None = None,
    ) -> CreatedInstance:
        """Rent an offer (`PUT /api/v0/asks/{id}/`, ref §3); interruptible iff a bid is given.

        Never retried blindly: only a request that provably did not reach Vast (connect error)
        or that Vast rejected unprocessed (429) is sent again. A read timeout or a 5xx raises
        `CreateOutcomeUnknown`: the caller adopts the instance by ``label`` later.
        Afterwards the instance's `is_bid` is checked against the request; on a mismatch it is
        destroyed and `BidMismatch` raised, because a lost price silently rents on-demand.
        Raises `OfferGone` when someone else got the offer.
        """
        body = build_create_body(
            image=image,
            disk_gb=disk_gb,
            label=label,
            onstart=onstart,
            env=env,
            runtype=runtype,
            bid_usd_per_hour=bid_usd_per_hour,
        )
        data = self._send_create(offer_id, body, label)
        instance_id = _int(data.get("new_contract"))
        if instance_id is None:
            if data.get("success") is False:
                raise error_for(200, json.dumps(data))
            raise CreateOutcomeUnknown(
                "create answered without new_contract", label=label, body=json.dumps(data)[:2000]
            )
        is_bid = self._check_bid(instance_id, bid_usd_per_hour is not None)
        return CreatedInstance(
            id=instance_id,
            instance_api_key=_str(data.get("instance_api_key")),
            created_stopped=data.get("success") is False,  # ref §3 [AUTO]: created stopped
            is_bid=is_bid,
            raw=dict(data),
        )

    def _send_create(self, offer_id: int, body: dict[str, Any], label: str) -> Mapping[str, Any]:
        path = f"/api/v0/asks/{offer_id}/"
        try:
            data = self._request("PUT", path, body=body, retry=RETRY_UNSENT_ONLY)
        except httpx.TransportError as exc:
            raise CreateOutcomeUnknown(f"create {offer_id}: {exc!r}", label=label) from exc
        except ProviderError as exc:
            if exc.status is not None and exc.status >= 500:
                raise CreateOutcomeUnknown(
                    exc.message, label=label, status=exc.status, code=exc.code, body=exc.body
                ) from exc
            # ref §3: a bare 404/410 on the ask means it is gone; one with another code (say
            # `not_found` for a wrong base URL) is not about the offer.
            if exc.status in (404, 410) and exc.code is None:
                raise OfferGone(
                    exc.message, status=exc.status, code=exc.code, body=exc.body
                ) from exc
            raise
        if not isinstance(data, Mapping):
            raise CreateOutcomeUnknown(f"create {offer_id}: unexpected answer", label=label)
        return data

    def _check_bid(self, instance_id: int, wanted_bid: bool) -> bool | None:
        """Compare the created instance's `is_bid` with the request; None if it cannot tell."""
        try:
            instance = self.show_instance(instance_id)
        except VastError as exc:
            logger.warning("vast: cannot verify is_bid of new instance %s: %s", instance_id, exc)
            return None
        if instance is None or instance.is_bid is None:
            logger.warning("vast: new instance %s shows no is_bid", instance_id)
            return None
        if instance.is_bid == wanted_bid:
            return instance.is_bid
        destroyed = self._destroy_quietly(instance_id)
        raise BidMismatch(
            f"instance {instance_id} has is_bid={instance.is_bid}, asked {wanted_bid}",
            instance_id=instance_id,
            destroyed=destroyed,
        )

    def _destroy_quietly(self, instance_id: int) -> bool:
        try:
            self.destroy_instance(instance_id)
        except VastError as exc:
            logger.error("vast: could not destroy mismatched instance %s: %s", instance_id, exc)
            return False
        return True

    # --- instances -----------------------------------------------------------------------

    def list_instances(
        self,
        *,
        label: str | None = None,
        select_filters: Mapping[str, Any] | None = None,
        page_size: int = 25,
    ) -> list[Instance]:
        """Every instance of the account, all pages (`GET /api/v1/instances/`, ref §4).

        ``select_filters`` may use stored columns only (e.g. `actual_status`, `label`).
        """
        filters = dict(select_filters or {})
        if label is not None:
            filters["label"] = {"eq": label}
        params: dict[str, Any] = {"limit": page_size}
        if filters:
            params["select_filters"] = filters
        return [parse_instance(r) for r in self._pages("/api/v1/instances/", params, "instances")]

    def show_instance(self, instance_id: int) -> Instance | None:
        """One instance, or None if Vast does not know it (any more) (ref §4: 200 + null)."""
        data = self._request("GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"})
        return instance_from_show(data)

    def instance_states(self, ids: Iterable[int]) -> dict[int, InstancePresence]:
        """List all instances once; report each requested id as present (with status) or gone."""
        return instance_presence(ids, self.list_instances())

    def destroy_instance(self, instance_id: int) -> bool:
        """Destroy (irreversible, ref §5). False when it was already gone: safe to repeat."""
        try:
            _require_success(self._request("DELETE", f"/api/v0/instances/{instance_id}/"))
        except InstanceGone:
            return False
        return True

    def label_instance(self, instance_id: int, label: str) -> None:
        """Set the label (ref §5: same PUT as stop/start, at most 1024 characters)."""
        body = {"label": label}
        _require_success(self._request("PUT", f"/api/v0/instances/{instance_id}/", body=body))

    def stop_instance(self, instance_id: int) -> StateChange:
        """Stop: the GPU is released, storage keeps billing (ref §5, §7)."""
        return self._set_state(instance_id, "stopped")

    def start_instance(self, instance_id: int) -> StateChange:
        """Start; `queued` is true when the GPU is busy and Vast waits for it (ref §5)."""
        return self._set_state(instance_id, "running")

    def _set_state(self, instance_id: int, state: str) -> StateChange:
        path = f"/api/v0/instances/{instance_id}/"
        data = self._request("PUT", path, body={"state": state})
        body = data if isinstance(data, Mapping) else {}
        if body.get("success") is False and body.get("error") == "resources_unavailable":
            message = str(body.get("msg") or body.get("message") or "state change queued")
            return StateChange(instance_id, state, queued=True, message=message)
        _require_success(body)
        return StateChange(instance_id, state, queued=False, message=str(body.get("msg") or ""))

    # --- billing and account ---------------------------------------------------------------

    def charges(
        self,
        start: datetime,
        end: datetime,
        *,
        types: Iterable[str] | None = None,
        page_size: int = 100,
    ) -> list[Charge]:
        """Usage charges per contract for a UTC window, all pages (`GET /api/v0/charges/`, §6a)."""
        filters: dict[str, Any] = {"day": {"gte": epoch_seconds(start), "lte": epoch_seconds(end)}}
        if types is not None:
            filters["type"] = {"in": list(types)}
        # ref §6a: the same filters on every page; only after_token changes.
        params = {"select_filters": filters, "limit": page_size}
        return [parse_charge(r) for r in self._pages("/api/v0/charges/", params, "results")]

    def invoices(self, start: datetime, end: datetime, *, page_size: int = 60) -> list[InvoiceRow]:
        """Payments and credits in a window, all pages (`GET /api/v1/invoices/`, ref §6b)."""
        filters = {"when": {"gte": epoch_seconds(start), "lte": epoch_seconds(end)}}
        params = {"select_filters": filters, "limit": page_size}
        return [parse_invoice_row(r) for r in self._pages("/api/v1/invoices/", params, "results")]

    def current_user(self) -> VastUser:
        """The account behind the API key (`GET /api/v0/users/current`, ref §5)."""
        data = self._request("GET", "/api/v0/users/current")
        return parse_user(data if isinstance(data, Mapping) else {})


def _decode(response: httpx.Response) -> Any:
    """JSON of a 2xx answer (None if empty); anything else becomes a typed exception."""
    text = response.text
    if not response.is_success:
        raise error_for(response.status_code, text, response.headers)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise ProviderError(
            "answer is not JSON", status=response.status_code, body=text[:2000]
        ) from None


def _require_success(data: Any) -> Mapping[str, Any]:
    """A 200 can still say `success: false` (ref §1, §6): raise the typed error then."""
    body = data if isinstance(data, Mapping) else {}
    if body.get("success") is False:
        raise error_for(200, json.dumps(body))
    return body
