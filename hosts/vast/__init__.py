"""The Vast.ai REST client: the only code in NomadGPU that talks to Vast (or the sandbox).

A small httpx client; the official ``vastai`` package is not a dependency. Every quirk handled
here cites the Vast API reference ``docs/vast-api.md`` by section ("docs/vast-api.md §N"). By
concern, bottom up:

- ``errors``: ``VastError`` and its subclasses, and ``error_for`` (an error answer → its class).
- ``parsing``: the typed results (``Offer``, ``Instance``, ``Charge``, ...) in one unit
  convention (``parsing/values.py`` has the table), their parsers, and the pure request-body
  builders; one file per thing parsed (its ``__init__`` lists them).
- ``transport``: ``RetryPolicy`` and ``RetryTransport``: backoff, wait hints, create's penalty.
- ``client``: ``VastClient`` and its ``from_settings`` factory.

The names below are re-exported so that callers import from ``hosts.vast`` alone.
"""

from hosts.vast.client import VastClient
from hosts.vast.errors import (
    AuthFailed,
    BidMismatch,
    CreateOutcomeUnknown,
    InstanceGone,
    InsufficientCredit,
    OfferGone,
    OfferRefused,
    ProviderError,
    ProviderUnreachable,
    RateLimited,
    VastError,
    error_for,
)
from hosts.vast.parsing import (
    IMAGE_KEPT,
    IMAGE_PULLED,
    MIB_PER_GIB,
    Charge,
    ChargeItem,
    CreatedInstance,
    Instance,
    InstancePresence,
    InvoiceRow,
    Offer,
    StateChange,
    VastUser,
    build_create_body,
    build_search_body,
    container_runtime_failed,
    encode_params,
    image_pull_seen,
    instance_from_show,
    instance_presence,
    parse_charge,
    parse_charge_item,
    parse_instance,
    parse_invoice_row,
    parse_offer,
    quantity_and_rate,
)
from hosts.vast.transport import RetryPolicy

__all__ = [
    "IMAGE_KEPT",
    "IMAGE_PULLED",
    "MIB_PER_GIB",
    "AuthFailed",
    "BidMismatch",
    "Charge",
    "ChargeItem",
    "CreateOutcomeUnknown",
    "CreatedInstance",
    "Instance",
    "InstanceGone",
    "InstancePresence",
    "InsufficientCredit",
    "InvoiceRow",
    "Offer",
    "OfferGone",
    "OfferRefused",
    "ProviderError",
    "ProviderUnreachable",
    "RateLimited",
    "RetryPolicy",
    "StateChange",
    "VastClient",
    "VastError",
    "VastUser",
    "build_create_body",
    "build_search_body",
    "container_runtime_failed",
    "encode_params",
    "error_for",
    "image_pull_seen",
    "instance_from_show",
    "instance_presence",
    "parse_charge",
    "parse_charge_item",
    "parse_instance",
    "parse_invoice_row",
    "parse_offer",
    "quantity_and_rate",
]
