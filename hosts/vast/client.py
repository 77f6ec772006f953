"""``VastClient``: one method per Vast call, built on the transport, errors and parsers.

Methods return the typed results of ``parsing`` and raise the errors of ``errors``; the retries
happen underneath, in ``transport``. ``create_instance`` is never retried unless the request
provably did not reach Vast (see its docstring). ``VastClient.from_settings`` is the factory
that reads Django settings, and the only place this package touches Django.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

import httpx

from hosts.vast.errors import (
    BidMismatch,
    CreateOutcomeUnknown,
    InstanceGone,
    OfferGone,
    OfferRefused,
    ProviderError,
    ProviderUnreachable,
    VastError,
    error_for,
)
from hosts.vast.parsing import (
    DEFAULT_ORDER,
    DEFAULT_RUNTYPE,
    Charge,
    CreatedInstance,
    Instance,
    InstancePresence,
    InvoiceRow,
    Offer,
    StateChange,
    VastUser,
    build_create_body,
    build_search_body,
    encode_params,
    epoch_seconds,
    instance_from_show,
    instance_presence,
    parse_charge,
    parse_instance,
    parse_invoice_row,
    parse_offer,
    parse_user,
)
from hosts.vast.parsing.values import int_or_none, str_or_none
from hosts.vast.transport import (
    RETRY_EXTENSION,
    RETRY_SAFE,
    RETRY_UNSENT_ONLY,
    UNSENT_ERRORS,
    RetryPolicy,
    RetryTransport,
)

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://console.vast.ai"
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=60.0, write=30.0, pool=10.0)


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
        from django.conf import settings  # noqa: PLC0415  (the client itself needs no Django)

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
            body = {}  # docs/vast-api.md §1: the SDK sends {} when it has nothing else to send
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
        """Every row of a keyset-paginated list (`next_token` → `after_token`,
        docs/vast-api.md §4/§6)."""
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
        """Search the market (`POST /api/v0/bundles/`, docs/vast-api.md §2).

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
        image_login: str | None = None,
    ) -> CreatedInstance:
        """Rent an offer (`PUT /api/v0/asks/{id}/`, docs/vast-api.md §3); interruptible iff a bid
        is given.
        IMAGE_LOGIN is a registry login for a private image (a secret: never logged here).

        Never retried blindly: only a request that provably did not reach Vast (connect error)
        or that Vast rejected unprocessed (429) is sent again. A read timeout or a 5xx raises
        `CreateOutcomeUnknown`: the caller adopts the instance by ``label`` later.
        Afterwards the instance's `is_bid` is checked against the request; on a mismatch it is
        destroyed and `BidMismatch` raised, because a lost price silently rents on-demand.
        Raises `OfferGone` when someone else got the offer, `OfferRefused` when Vast refuses
        this offer (not the key: that is `AuthFailed`).
        """
        body = build_create_body(
            image=image,
            disk_gb=disk_gb,
            label=label,
            onstart=onstart,
            env=env,
            runtype=runtype,
            bid_usd_per_hour=bid_usd_per_hour,
            image_login=image_login,
        )
        data = self._send_create(offer_id, body, label)
        instance_id = int_or_none(data.get("new_contract"))
        if instance_id is None:
            if data.get("success") is False:
                raise error_for(200, json.dumps(data))
            raise CreateOutcomeUnknown(
                "create answered without new_contract", label=label, body=json.dumps(data)[:2000]
            )
        is_bid = self._check_bid(instance_id, bid_usd_per_hour is not None)
        return CreatedInstance(
            id=instance_id,
            instance_api_key=str_or_none(data.get("instance_api_key")),
            # docs/vast-api.md §3 [AUTO]: created stopped
            created_stopped=data.get("success") is False,
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
            # docs/vast-api.md §3: a bare 404/410 on the ask means it is gone; one with another
            # code (say `not_found` for a wrong base URL) is not about the offer.
            if exc.status in (404, 410) and exc.code is None:
                raise OfferGone(
                    exc.message, status=exc.status, code=exc.code, body=exc.body
                ) from exc
            if refuses_the_offer(exc):
                raise OfferRefused(
                    exc.message,
                    offer_id=int_or_none(_body_field(exc.body, "ask_id")) or offer_id,
                    status=exc.status,
                    code=exc.code,
                    body=exc.body,
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
        """Every instance of the account, all pages (`GET /api/v1/instances/`, docs/vast-api.md §4).

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
        """One instance, or None if Vast does not know it (any more)
        (docs/vast-api.md §4: 200 + null)."""
        data = self._request("GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"})
        return instance_from_show(data)

    def instance_states(self, ids: Iterable[int]) -> dict[int, InstancePresence]:
        """List all instances once; report each requested id as present (with status) or gone."""
        return instance_presence(ids, self.list_instances())

    def destroy_instance(self, instance_id: int) -> bool:
        """Destroy (irreversible, docs/vast-api.md §5). False when it was already gone: safe to
        repeat.

        Gone reads two ways: 404 `no_such_instance` (Vast's generated spec) and 404
        `not_found` (its hand-written docs). A wrong base URL could answer `not_found` too, and
        believing it would leave the instance billing, so that one is checked with show-one
        (`{"instances": null}` for an instance that does not exist, docs/vast-api.md §4)."""
        try:
            _require_success(self._request("DELETE", f"/api/v0/instances/{instance_id}/"))
        except InstanceGone:
            return False
        except ProviderError as exc:
            if not (exc.status == 404 and exc.code == "not_found"):
                raise
            if self.show_instance(instance_id) is not None:
                raise
            return False
        return True

    def label_instance(self, instance_id: int, label: str) -> None:
        """Set the label (docs/vast-api.md §5: same PUT as stop/start, at most 1024 characters)."""
        body = {"label": label}
        _require_success(self._request("PUT", f"/api/v0/instances/{instance_id}/", body=body))

    def stop_instance(self, instance_id: int) -> StateChange:
        """Stop: the GPU is released, storage keeps billing (docs/vast-api.md §5, §7)."""
        return self._set_state(instance_id, "stopped")

    def start_instance(self, instance_id: int) -> StateChange:
        """Start; `queued` is true when the GPU is busy and Vast waits for it
        (docs/vast-api.md §5)."""
        return self._set_state(instance_id, "running")

    def change_bid(self, instance_id: int, price: float) -> None:
        """Set an interruptible instance's bid, $/h per machine (`PUT /api/v0/instances/
        bid_price/{id}/` with `{"client_id": "me", "price": x}`, docs/vast-api.md §5, as the CLI's
        `vastai change bid` sends it). A bid that reaches the machine's `min_bid` wins it back
        from a higher bidder; one lowered under it loses the machine.

        Vast's spec (vast-ai/docs `openapi.yaml`) answers `{"success": true}`, 400
        `invalid_args` for a price outside 0.001-32 (`ProviderError`) and 404
        `no_such_instance` (`InstanceGone`). Setting a price is idempotent, so 429s (one call per
        5.5 s, docs/vast-api.md §1, a JSON `detail` naming the threshold) and network errors are
        retried.
        """
        body = {"client_id": "me", "price": float(price)}
        path = f"/api/v0/instances/bid_price/{instance_id}/"
        _require_success(self._request("PUT", path, body=body))

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
        # docs/vast-api.md §6a: the same filters on every page; only after_token changes.
        params = {"select_filters": filters, "limit": page_size}
        return [parse_charge(r) for r in self._pages("/api/v0/charges/", params, "results")]

    def invoices(self, start: datetime, end: datetime, *, page_size: int = 60) -> list[InvoiceRow]:
        """Payments and credits in a window, all pages (`GET /api/v1/invoices/`,
        docs/vast-api.md §6b)."""
        filters = {"when": {"gte": epoch_seconds(start), "lte": epoch_seconds(end)}}
        params = {"select_filters": filters, "limit": page_size}
        return [parse_invoice_row(r) for r in self._pages("/api/v1/invoices/", params, "results")]

    def current_user(self) -> VastUser:
        """The account behind the API key (`GET /api/v0/users/current`, docs/vast-api.md §5)."""
        data = self._request("GET", "/api/v0/users/current")
        return parse_user(data if isinstance(data, Mapping) else {})


def refuses_the_offer(exc: ProviderError) -> bool:
    """Whether a create's refusal is about that one offer: a 403 that does not name the key
    (``errors`` left it a ``ProviderError``; vast-ai/docs create_instance.yaml: "Offer N is not
    your own"), or `invalid_price`, a quote gone stale since the search (the same file)."""
    return exc.status == 403 or exc.code == "invalid_price"


def _body_field(body: str, key: str) -> Any:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get(key) if isinstance(data, Mapping) else None


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
    """A 200 can still say `success: false` (docs/vast-api.md §1, §6): raise the typed
    error then."""
    body = data if isinstance(data, Mapping) else {}
    if body.get("success") is False:
        raise error_for(200, json.dumps(body))
    return body
