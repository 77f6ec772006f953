"""What Vast returns, as typed dataclasses, and the pure functions between them and Vast JSON.

Nothing here does I/O, so all of it is tested on plain dicts. One file per thing parsed:

- ``values``: one raw value → a NomadGPU value (numbers, strings, times) and the unit table
  every result follows.
- ``prices``: an offer's or an instance's prices in those units, and what a price of a
  several-GPU offer means (the whole instance's).
- ``offers``: one offer of a market search → ``Offer``.
- ``instances``: ``Instance`` and the answers to create, stop and start; whether a requested
  instance is still there (``instance_presence``); whether its host's container runtime failed
  (``container_runtime_failed``); what Docker's pull words say of its image
  (``image_pull_seen``).
- ``ledger``: charges (``Charge``, ``ChargeItem``, ``quantity_and_rate``), payments and credits
  (``InvoiceRow``) and the account (``VastUser``).
- ``bodies``: what we send: the search and create bodies, query parameters, the bid range.

Vast's error answers are parsed in ``hosts.vast.errors``. The names below are re-exported so
that ``hosts.vast`` and ``hosts.vast.parsing`` offer what the single module did.
"""

from hosts.vast.parsing.bodies import (
    BID_MAX_USD,
    BID_MIN_USD,
    CHANGE_BID_MAX_USD,
    DEFAULT_ORDER,
    DEFAULT_RUNTYPE,
    SEARCH_DEFAULTS,
    build_create_body,
    build_search_body,
    encode_params,
)
from hosts.vast.parsing.instances import (
    IMAGE_KEPT,
    IMAGE_PULLED,
    CreatedInstance,
    Instance,
    InstancePresence,
    StateChange,
    container_runtime_failed,
    image_pull_seen,
    instance_from_show,
    instance_presence,
    parse_instance,
)
from hosts.vast.parsing.ledger import (
    Charge,
    ChargeItem,
    InvoiceRow,
    VastUser,
    parse_charge,
    parse_charge_item,
    parse_invoice_row,
    parse_user,
    quantity_and_rate,
)
from hosts.vast.parsing.offers import Offer, parse_offer
from hosts.vast.parsing.values import (
    GB_PER_TB,
    HOURS_PER_STORAGE_MONTH,
    MIB_PER_GIB,
    epoch_seconds,
    utc_from_epoch,
)

__all__ = [
    "BID_MAX_USD",
    "BID_MIN_USD",
    "CHANGE_BID_MAX_USD",
    "DEFAULT_ORDER",
    "DEFAULT_RUNTYPE",
    "GB_PER_TB",
    "HOURS_PER_STORAGE_MONTH",
    "IMAGE_KEPT",
    "IMAGE_PULLED",
    "MIB_PER_GIB",
    "SEARCH_DEFAULTS",
    "Charge",
    "ChargeItem",
    "CreatedInstance",
    "Instance",
    "InstancePresence",
    "InvoiceRow",
    "Offer",
    "StateChange",
    "VastUser",
    "build_create_body",
    "build_search_body",
    "container_runtime_failed",
    "encode_params",
    "epoch_seconds",
    "image_pull_seen",
    "instance_from_show",
    "instance_presence",
    "parse_charge",
    "parse_charge_item",
    "parse_instance",
    "parse_invoice_row",
    "parse_offer",
    "parse_user",
    "quantity_and_rate",
    "utc_from_epoch",
]
