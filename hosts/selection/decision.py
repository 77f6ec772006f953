"""What is stored and shown of a decision: the ranked candidates (``Ranked``), the fields of an
offer the decision rested on (``offer_summary``) and the attempt's record (``Decision``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hosts.selection.bids import INTERRUPTIBLE
from hosts.selection.costs import CostBreakdown
from hosts.selection.filters import Rejection, job_dph_total
from hosts.selection.profile import JobProfile
from hosts.selection.rental_costs import RentalCost
from hosts.selection.requirements import Requirements
from hosts.vast import Offer


@dataclass(frozen=True)
class MemoryNote:
    """What the team's memory says of a ranked offer's machine (``machine_memory.memory_parts``:
    HEAD and NOTES) and what its record adds to the expected total (USD; None when it cannot
    be told). The sentence is ``machine_memory.memory_words`` with USD as money is written
    (``jobs.rent_decision.RankedOffer.memory_words``)."""

    machine_id: int
    head: str
    notes: tuple[str, ...]
    usd: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "head": self.head,
            "notes": list(self.notes),
            "usd": self.usd,
        }


@dataclass(frozen=True)
class Ranked:
    """One acceptable offer, the best way to rent it, and its expected cost: COST is the run
    without interruptions at that rental's price, RENTAL the expected total with them. MEMORY:
    what the team's record of its machine adds, when there is one."""

    offer: Offer
    cost: CostBreakdown
    rental: RentalCost
    memory: MemoryNote | None = None

    @property
    def expected_total_usd(self) -> float:
        """What the ranking compares."""
        return self.rental.expected_total_usd

    def as_dict(self, req: Requirements) -> dict[str, Any]:
        """JSON-ready: the offer's deciding fields, the cost breakdown, the rental."""
        data = {
            "offer": offer_summary(self.offer, req),
            "cost": self.cost.as_dict(),
            "rental": self.rental.as_dict(),
        }
        if self.memory is not None:
            data["memory"] = self.memory.as_dict()
        return data


def offer_summary(offer: Offer, req: Requirements) -> dict[str, Any]:
    """The fields of an offer that the decision rested on, as plain JSON data."""
    return {
        "id": offer.id,
        "machine_id": offer.machine_id,
        "host_id": offer.host_id,
        "gpu_name": offer.gpu_name,
        "num_gpus": offer.num_gpus,
        "dph_base": offer.dph_base,
        "dph_total": job_dph_total(offer, req.disk_gb),
        "storage_usd_per_gb_hour": offer.storage_usd_per_gb_hour,
        "download_usd_per_gb": offer.download_usd_per_gb,
        "upload_usd_per_gb": offer.upload_usd_per_gb,
        "inet_down_mbps": offer.inet_down_mbps,
        "inet_up_mbps": offer.inet_up_mbps,  # the adaptive interval's δ before an upload
        "reliability": offer.reliability,
        "dlperf": offer.dlperf,
        "verified": offer.verified,
        "datacenter": offer.datacenter,
        "geolocation": offer.geolocation,
    }


@dataclass(frozen=True)
class Decision:
    """The offer to rent, the runners-up and what was turned away, for the attempt's record."""

    chosen: Ranked
    candidates: tuple[Ranked, ...]  # the best few, chosen first
    offers_seen: int
    offers_ranked: int
    rejected_by_rule: Mapping[str, int]
    requirements: Requirements
    profile: JobProfile
    alternatives: tuple[dict[str, Any], ...] = ()  # the chosen offer's other ways to rent
    # Offers whose machine the team's memory set aside (2 incidents in 7 days), and why.
    set_aside: tuple[Rejection, ...] = ()
    # Why the memory rented a safer runner-up than the cheapest (``ranking.safer_pick``), or "".
    safer: str = ""

    @property
    def chosen_offer_id(self) -> int:
        """The ask id to rent."""
        return self.chosen.offer.id

    @property
    def bid_usd_per_hour(self) -> float | None:
        """The bid to place, or None for an on-demand rental."""
        chosen = self.chosen.rental
        return chosen.gpu_usd_per_hour if chosen.rental.kind == INTERRUPTIBLE else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, to store on the attempt and show on the job page."""
        req = self.requirements
        total = self.chosen.expected_total_usd
        return {
            "chosen_offer_id": self.chosen_offer_id,
            "estimated_total_usd": total if math.isfinite(total) else None,
            "rental": self.chosen.rental.as_dict(),
            "alternatives": self.alternatives,
            "chosen": self.chosen.as_dict(req),
            "candidates": [c.as_dict(req) for c in self.candidates],
            "offers_seen": self.offers_seen,
            "offers_ranked": self.offers_ranked,
            "offers_rejected": sum(self.rejected_by_rule.values()),
            "rejected_by_rule": dict(self.rejected_by_rule),
            "requirements": req.as_dict(),
            "profile": self.profile.as_dict(),
            "set_aside_by_memory": [
                {"machine_id": r.machine_id, "detail": r.detail} for r in self.set_aside
            ],
            "safer_pick": self.safer,
        }
