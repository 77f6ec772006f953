"""What a job needs of an offer (``Requirements``), and the search that asks Vast for such offers.

``filters`` checks every rule again locally: the search only saves bandwidth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hosts.vast import MIB_PER_GIB


def _gpu_name(name: str) -> str:
    # Vast's CLI writes RTX_4090 for "RTX 4090"; the API and offers use spaces
    # (docs/vast-api.md §2).
    return str(name).replace("_", " ").strip()


@dataclass(frozen=True)
class Requirements:
    """What an offer must have to be considered at all.

    ``min_gpu_ram_gb`` is per GPU in GiB as the driver reports it: a "24 GB" RTX 4090 shows
    23.99 GiB, so ask for what the model needs, not for the card's nominal size.
    ``num_gpus`` is matched exactly: extra GPUs would be billed and sit idle.
    ``disk_gb`` is the disk to allocate, which is also the storage billed.
    ``rental`` has no default: how to rent is the product's choice, made once in ``JobSpec``
    (``jobs.renting.terms`` gives every field from there); the defaults below only save tests
    and benchmarks typing, and never stand in for a job's own value.
    """

    gpu_names: tuple[str, ...] = ()  # empty: any model
    num_gpus: int = 1
    min_gpu_ram_gb: float = 0.0
    min_reliability: float = 0.98
    min_inet_down_mbps: float = 500.0
    disk_gb: float = 50.0
    min_cuda: float | None = None
    verified_only: bool = True
    datacenter_only: bool = False
    max_dph: float | None = None  # $/h, compared with dph_total (GPU + this job's storage)
    avoid_machine_ids: frozenset[int] = frozenset()
    rental: str = field(kw_only=True)  # "on-demand" | "interruptible" | "auto"
    max_bid_dph: float | None = None  # the highest bid $/h an interruptible rental may place
    bid_margins: tuple[float, ...] = ()  # the margins over min_bid to weigh; empty: BID_MARGINS

    def __post_init__(self) -> None:
        # Accept what JSON gives (lists, "RTX_4090") and keep the frozen object hashable.
        object.__setattr__(self, "gpu_names", tuple(_gpu_name(n) for n in self.gpu_names))
        avoid = frozenset(int(m) for m in self.avoid_machine_ids)
        object.__setattr__(self, "avoid_machine_ids", avoid)
        object.__setattr__(self, "bid_margins", tuple(float(m) for m in self.bid_margins))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples and sets become sorted lists."""
        data = asdict(self)
        data["gpu_names"] = list(self.gpu_names)
        data["avoid_machine_ids"] = sorted(self.avoid_machine_ids)
        data["bid_margins"] = list(self.bid_margins)
        return data


# Offers asked for in one search. Vast documents neither its default nor its maximum, and its
# default order is its own `score`: the cost ranking needs every offer that passes the filter,
# so ask for many (the sandbox answers 64 when `limit` is missing, to make forgetting it show).
SEARCH_LIMIT = 256


def vast_query(req: Requirements) -> dict[str, Any]:
    """The server-side prefilter for ``VastClient.search_offers`` in Vast's query language.

    ``allocated_storage`` makes Vast price ``dph_total`` for this job's disk and doubles as a
    ``disk_space >=`` filter (docs/vast-api.md §2). ``filter_offers`` still re-checks every
    rule locally, so a server that ignores a key only costs bandwidth, never a wrong rental.
    """
    query: dict[str, Any] = {
        "num_gpus": {"eq": req.num_gpus},
        "reliability": {"gte": req.min_reliability},
        "inet_down": {"gte": req.min_inet_down_mbps},
        "disk_space": {"gte": req.disk_gb},
        # None: no condition at all (the client drops the key, as the CLI's "any" does);
        # without the key the client would add its `verified eq true` default.
        "verified": {"eq": True} if req.verified_only else None,
        "allocated_storage": req.disk_gb,
    }
    if req.gpu_names:
        names = list(req.gpu_names)
        query["gpu_name"] = {"eq": names[0]} if len(names) == 1 else {"in": names}
    if req.min_gpu_ram_gb:
        query["gpu_ram"] = {"gte": req.min_gpu_ram_gb * MIB_PER_GIB}  # Vast's "MB" are MiB
    if req.min_cuda is not None:
        query["cuda_max_good"] = {"gte": req.min_cuda}
    if req.datacenter_only:
        query["datacenter"] = {"eq": True}
    if req.max_dph is not None:
        query["dph_total"] = {"lte": req.max_dph}
    if req.avoid_machine_ids:
        query["machine_id"] = {"notin": sorted(req.avoid_machine_ids)}
    return query
