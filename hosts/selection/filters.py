"""Which offers a job may rent: the requirement rules, checked in order, and why an offer failed.

Each rule names what it checks; an offer is turned away under the first rule it fails, with a
line for the job page (``Rejection``). ``ranking`` adds three rules of its own for an offer that
passes these: no speed estimate, no acceptable bid, a contract that ends too soon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hosts.selection.costs import SECONDS_PER_HOUR, CostBreakdown
from hosts.selection.requirements import Requirements
from hosts.vast import Offer


@dataclass(frozen=True)
class Rejection:
    """Why one offer was not considered: the first rule it failed, in words for the job page."""

    offer_id: int
    machine_id: int | None
    rule: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def job_dph_total(offer: Offer, disk_gb: float) -> float | None:
    """$/h of GPU plus this job's storage, i.e. what Vast shows as ``dph_total``.

    Computed from the parts when they are known, because an offer's own ``dph_total`` is
    priced for whatever ``allocated_storage`` its search used (market files carry none).
    """
    if offer.dph_base is None or offer.storage_usd_per_gb_hour is None:
        return offer.dph_total
    return offer.dph_base + offer.storage_usd_per_gb_hour * disk_gb


def _at_least(value: float | None, minimum: float, what: str) -> str | None:
    if value is None:
        return f"{what} unknown"
    return f"{what} {value:g} < {minimum:g}" if value < minimum else None


def _avoided(o: Offer, r: Requirements) -> str | None:
    if o.machine_id is not None and o.machine_id in r.avoid_machine_ids:
        return f"machine {o.machine_id} is on the job's avoid list"
    return None


def _wrong_model(o: Offer, r: Requirements) -> str | None:
    if r.gpu_names and o.gpu_name not in r.gpu_names:
        return f"{o.gpu_name or 'unknown GPU'} is not one of {', '.join(r.gpu_names)}"
    return None


def _wrong_count(o: Offer, r: Requirements) -> str | None:
    return None if o.num_gpus == r.num_gpus else f"{o.num_gpus} GPUs, need {r.num_gpus}"


def _too_little_vram(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.gpu_ram_gb, r.min_gpu_ram_gb, "GiB per GPU") if r.min_gpu_ram_gb else None


def _unverified(o: Offer, r: Requirements) -> str | None:
    return "host not verified" if r.verified_only and not o.verified else None


def _not_datacenter(o: Offer, r: Requirements) -> str | None:
    return "not a datacenter host" if r.datacenter_only and not o.datacenter else None


def _unreliable(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.reliability, r.min_reliability, "reliability")


def _slow_link(o: Offer, r: Requirements) -> str | None:
    # A link of 0 Mbit/s would make every download last forever, whatever the minimum says.
    if o.inet_down_mbps is not None and o.inet_down_mbps <= 0:
        return "no download bandwidth"
    return _at_least(o.inet_down_mbps, r.min_inet_down_mbps, "download Mbit/s")


def _small_disk(o: Offer, r: Requirements) -> str | None:
    return _at_least(o.disk_space_gb, r.disk_gb, "free disk GB")


def _old_cuda(o: Offer, r: Requirements) -> str | None:
    return None if r.min_cuda is None else _at_least(o.cuda_max_good, r.min_cuda, "max CUDA")


def _unpriced(o: Offer, r: Requirements) -> str | None:
    # A missing traffic price could hide the $45/TB host of the field report: never assume 0.
    prices = {
        "GPU $/h": o.dph_base,
        "storage $/GB": o.storage_usd_per_gb_hour,
        "download $/GB": o.download_usd_per_gb,
        "upload $/GB": o.upload_usd_per_gb,
    }
    missing = [name for name, value in prices.items() if value is None]
    return f"no price for {', '.join(missing)}" if missing else None


def _too_expensive(o: Offer, r: Requirements) -> str | None:
    if r.max_dph is None:
        return None
    total = job_dph_total(o, r.disk_gb)
    if total is None:
        return "dph_total unknown"
    return f"${total:.3f}/h > ${r.max_dph:.3f}/h" if total > r.max_dph else None


# Checked in this order; an offer is reported under the first rule it fails.
RULES: tuple[tuple[str, Callable[[Offer, Requirements], str | None]], ...] = (
    ("avoid_list", _avoided),
    ("gpu_name", _wrong_model),
    ("num_gpus", _wrong_count),
    ("gpu_ram", _too_little_vram),
    ("verified", _unverified),
    ("datacenter", _not_datacenter),
    ("reliability", _unreliable),
    ("inet_down", _slow_link),
    ("disk_space", _small_disk),
    ("cuda", _old_cuda),
    ("unknown_price", _unpriced),
    ("max_dph", _too_expensive),
)
RULE_UNKNOWN_SPEED = "unknown_speed"  # added by rank_offers: no way to estimate the duration
RULE_CONTRACT = "contract_duration"  # added by rank_offers: the host's contract ends too soon
NOT_BIDDABLE = "not_biddable"  # added by rank_offers: no bid, or none the job allows
# How much longer than the job's expected rest a host's contract must run: estimates are off
# (a slow host did 6 s/step instead of 4 in the field report), and a recovery adds time.
CONTRACT_MARGIN = 0.5  # +50 % of the expected hours ...
CONTRACT_SLACK_H = 1.0  # ... and an hour


def contract_too_short(offer: Offer, cost: CostBreakdown) -> str | None:
    """Why OFFER's contract would end before the job could (its ``duration`` is shorter than the
    expected rest plus ``CONTRACT_MARGIN`` and ``CONTRACT_SLACK_H``), or None if it is long
    enough or unknown."""
    if offer.duration_s is None:
        return None
    left_h, needed_h = offer.duration_s / SECONDS_PER_HOUR, cost.wall_h
    if left_h >= needed_h * (1 + CONTRACT_MARGIN) + CONTRACT_SLACK_H:
        return None
    return f"contract ends in {left_h:.1f} h; the job needs about {needed_h:.1f} h"


def first_failed_rule(offer: Offer, req: Requirements) -> Rejection | None:
    """The first requirement the offer fails, or None when it meets them all."""
    for rule, check in RULES:
        detail = check(offer, req)
        if detail is not None:
            return Rejection(offer.id, offer.machine_id, rule, detail)
    return None


def filter_offers(
    offers: Iterable[Offer], req: Requirements
) -> tuple[list[Offer], list[Rejection]]:
    """Split offers into those meeting ``req`` (order kept) and a rejection for each other."""
    kept: list[Offer] = []
    rejected: list[Rejection] = []
    for offer in offers:
        rejection = first_failed_rule(offer, req)
        if rejection is None:
            kept.append(offer)
        else:
            rejected.append(rejection)
    return kept, rejected
