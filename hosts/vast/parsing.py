"""What Vast returns, as typed dataclasses, and the pure functions between them and Vast JSON.

Parsers turn Vast's JSON into ``Offer``, ``Instance``, ``Charge`` and the other results; the
builders make the request bodies and query parameters (``build_search_body``,
``build_create_body``, ``encode_params``). Nothing here does I/O, so all of it is tested on plain
dicts. "ref §N" cites the shared reference ``shared/vast-api.md``.

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

Several GPUs (issue 31): every price of an offer is the price of the whole instance, all its
``num_gpus`` together, and is never divided or multiplied by the count here or downstream.

- ``dph_base``, ``dph_total``, ``min_bid``: the host types per-GPU prices (vast-ai/vast-cli
  ``list machine``: ``--price_gpu`` "per gpu rental price in $/hour", ``--price_min_bid``
  "per gpu minimum bid price floor in $/hour"), and a machine publishes one offer per slice of
  its GPUs (docs.vast.ai ``guides/concepts``: "one or more offers corresponding to different
  slices of its GPUs"), priced for the slice: the renter's bid is "per machine bid price in
  $/hour" (``create instance --bid_price``, ``change bid --price``). dstack's catalogue
  (dstackai/gpuhunt ``providers/vastai.py``) takes ``dph_base`` + storage and ``min_bid`` as
  the price of an item of ``gpu_count = num_gpus``, untouched. So a search with
  ``num_gpus: {"eq": 4}`` answers 4-GPU slices at 4 x the per-GPU price; ``gpu_frac`` (the
  slice's share of the machine) changes which offers match, not what a price means.
- ``storage_cost``: $/GB/month of the instance's disk (``--price_disk``), per GB allocated,
  not per GPU; ``inet_*_cost``: $/GB moved, not per GPU.
- ``dlperf``, ``gpu_total_ram``, ``cpu_ram``: the whole slice; ``gpu_ram`` is per GPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

HOURS_PER_STORAGE_MONTH = 720  # ref §2: storage_total_cost = storage_cost * GB / 720
MIB_PER_GIB = 1024
GB_PER_TB = 1024  # ref §2 / market README: $/TB prices ÷ 1024 give the $/GB field
BID_MIN_USD, BID_MAX_USD = 0.001, 128.0  # ref §3: accepted `price` range
# A bid changed later may not go as high (vast-ai/docs openapi.yaml, change-bid: 0.001-32).
CHANGE_BID_MAX_USD = 32.0
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
    wording is not recognised. `rate` is USD per `rate_unit` (e.g. "hour", "GB", "GB-hour"); a
    storage item in "hours" at $/"hour" is the whole disk's time and rate, not per GB.
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


# What a status_msg says when the host's container runtime could not create the container:
# Docker's "OCI runtime create failed" (dstack's Vast backend, compute.py, fails a `created`
# instance on it), the NVIDIA runtime's CDI and nvidia-container-cli errors inside it (a
# recorded instance body: "... OCI runtime create failed: ... failed to inject CDI devices:
# unresolvable CDI devices"). The host's fault, not the image's: a missing image or a failed
# pull reads otherwise ("manifest ... not found", "error pulling image").
_RUNTIME_FAILED = re.compile(
    r"OCI runtime create failed|failed to inject CDI devices|unresolvable CDI devices"
    r"|nvidia-container-cli: initialization error",
    re.IGNORECASE,
)


def container_runtime_failed(status_msg: str | None) -> bool:
    """Whether an instance's ``status_msg`` says the host's container runtime failed to create
    the container: a host fault, which no restart or higher bid on that host fixes."""
    return bool(_RUNTIME_FAILED.search(status_msg or ""))


def instance_from_show(body: Any) -> Instance | None:
    """Show-one answer → `Instance`, or None when Vast says `{"instances": null}` (ref §4).

    The key is plural but holds one object; tolerate a one-element list too.
    """
    found = body.get("instances") if isinstance(body, Mapping) else None
    if isinstance(found, list):
        found = found[0] if found else None
    return parse_instance(found) if isinstance(found, Mapping) else None


_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# ref §6a: "96.000 hours at $0.389/hour"; also "12.3 GB downloaded at $0.0005/GB". Vast's
# billing page words a storage item the same way, "0.9765233 hours at $0.018/hour": the hours
# the disk existed, at a per-hour rate for the whole disk (not per GB).
_QUANTITY_AT_RATE = re.compile(
    rf"^\s*(?P<quantity>{_NUMBER})\s*(?P<unit>[A-Za-z][\w-]*)(?:\s+[A-Za-z]+)*?"
    rf"\s+at\s+\$\s?(?P<rate>{_NUMBER})\s*(?:/|per\s+)\s*(?P<rate_unit>[\w/-]+)",
    re.IGNORECASE,
)
# Storage quoted per month: "10.0 GB for 2.500 hours at $0.150/GB/month" (the sandbox's wording
# before it took Vast's; kept for charges imported then). Read in our units: GB-hours at
# $/GB-hour (÷ 720).
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
    image_login: str | None = None,
) -> dict[str, Any]:
    """The body of `PUT /asks/{id}/` (ref §3). A bid price is what makes it interruptible;
    IMAGE_LOGIN (docker login arguments, "-u USER -p TOKEN ghcr.io") lets the host pull a
    private image, and is sent only when given."""
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
    if image_login:
        body["image_login"] = image_login
    return body


def encode_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters the SDK's way: strings as-is, everything else as JSON (ref §1)."""
    return {
        k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items() if v is not None
    }
