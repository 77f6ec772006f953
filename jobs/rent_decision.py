"""The one reader of a stored rent decision: ``Attempt.decision`` (``selection.Decision.
as_dict``, stored at rent) read by name here only: the image pull priced (and the chance the
machine held the image), the chosen offer's download and upload speeds, the planned speed (and
what the machine was promised before the team's memory of it) and upload cost, the choice after
an outbid or while a host is offline, the ranked candidates the job page shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hosts import selection
from hosts.vast import Offer
from hosts.wait_or_move import ReturnHistory, WaitOrMove, wait_or_move
from jobs.models import Attempt
from nomadgpu.humanize import money


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RentDecision:
    """The rent decision stored on an attempt (``Attempt.decision``: ``selection.Decision.
    as_dict``, or ``{"adopted": True}`` for an instance adopted by its label), read by name
    here only. Every reader is lenient: an attempt rented before a key was stored reads as
    having no figure for it."""

    data: Mapping[str, Any]

    @classmethod
    def of(cls, attempt: Attempt) -> RentDecision:
        """ATTEMPT's decision (empty when none was stored)."""
        return cls(_mapping(attempt.decision))

    def offer_summary(self, offer_id: int | None) -> Mapping[str, Any]:
        """The summary of offer OFFER_ID among the chosen offer and the candidates; {} if absent
        (an adopted instance, or a decision recorded without candidates)."""
        ranked = [
            _mapping(self.data.get("chosen")),
            *map(_mapping, self.data.get("candidates") or []),
        ]
        offers = (_mapping(r.get("offer")) for r in ranked)
        return next((o for o in offers if offer_id is not None and o.get("id") == offer_id), {})

    @property
    def chosen_gpu_count(self) -> int:
        """How many GPUs the rented offer has (its price is for all of them); 1 when unknown."""
        count = self.chosen_offer.get("num_gpus")
        return count if isinstance(count, int) else 1

    @property
    def candidate_count(self) -> int:
        """How many offers the decision weighed (its stored candidates)."""
        return len(self.data.get("candidates") or [])

    @property
    def chosen_offer(self) -> Mapping[str, Any]:
        """The rented offer's deciding fields (``selection.offer_summary``)."""
        return _mapping(_mapping(self.data.get("chosen")).get("offer"))

    @property
    def chosen_cost(self) -> Mapping[str, Any]:
        """The chosen rental's run without interruptions (``selection.CostBreakdown``)."""
        return _mapping(_mapping(self.data.get("chosen")).get("cost"))

    @property
    def chosen_rental(self) -> Mapping[str, Any]:
        """How the offer was rented and its expected total (``selection.RentalCost``)."""
        chosen = _mapping(self.data.get("chosen"))
        return _mapping(chosen.get("rental") or self.data.get("rental"))

    def weighed_offers(self, req: selection.Requirements) -> list[tuple[Offer, float | None]]:
        """The offers this decision ranked (its candidates), each with the GPU $/h it was to
        be rented at: its bid where REQ allows bidding, else on demand (None: ``dph_base``)."""
        found = []
        for candidate in map(_mapping, self.data.get("candidates") or []):
            offer = offer_from_summary(_mapping(candidate.get("offer")))
            if offer is None:
                continue
            bid = _mapping(_mapping(candidate.get("rental")).get("rental")).get("kind")
            price = _mapping(candidate.get("rental")).get("gpu_usd_per_hour")
            bids = bid == selection.INTERRUPTIBLE and req.rental != selection.ON_DEMAND
            found.append((offer, float(price) if bids and price else None))
        return found

    @property
    def race(self) -> Mapping[str, Any]:
        """The hedged rent's plan (``selection.race.RacePlan.as_dict``); {} for a plain rent."""
        return _mapping(self.data.get("race"))

    def with_chosen(self, offer_id: int | None) -> dict[str, Any]:
        """This decision with OFFER_ID's candidate as the chosen one (a hedged rent's winner:
        what its readers price, its speed, its outbid and offline choices, are that host's);
        unchanged when OFFER_ID is not among the candidates."""
        for candidate in map(_mapping, self.data.get("candidates") or []):
            if offer_id is not None and _mapping(candidate.get("offer")).get("id") == offer_id:
                rental = candidate.get("rental") or self.data.get("rental")
                return {
                    **self.data,
                    "chosen_offer_id": offer_id,
                    "chosen": dict(candidate),
                    "rental": rental,
                }
        return dict(self.data)

    @property
    def image_gb(self) -> float:
        """The image pull as priced at rent (the profile's ``image_gb``; 0 without one)."""
        return float(_mapping(self.data.get("profile")).get("image_gb") or 0.0)

    @property
    def image_cached_chance(self) -> float:
        """The chance, at rent, that the machine still held the image (``ImageCache``; 0 when
        not stored): the start deadline allows no pull where it is 0.5 or more."""
        chance = self.chosen_cost.get("image_cached_chance")
        return float(chance) if isinstance(chance, int | float) else 0.0

    @property
    def download_mbps(self) -> float | None:
        """The download speed the rented offer advertised, if it did."""
        mbps = self.chosen_offer.get("inet_down_mbps")
        return float(mbps) if isinstance(mbps, int | float) and mbps > 0 else None

    @property
    def startup_download_gb(self) -> float:
        """What the start-up was priced to download on the chosen offer: the image, the model
        and, for a resume, the checkpoint (0 without a stored decision)."""
        return float(self.chosen_cost.get("download_gb") or 0.0)

    @property
    def upload_mbps(self) -> float | None:
        """The upload speed the rented offer advertised, if it did."""
        mbps = self.chosen_offer.get("inet_up_mbps")
        return float(mbps) if isinstance(mbps, int | float) and mbps > 0 else None

    @property
    def promised_seconds_per_step(self) -> float | None:
        """The s/step the rent expected of the machine before anything the machine itself
        showed: its DLPerf's (or its GPU model's measured) speed, without the memory's factor
        (``CostBreakdown.machine_speed_factor``); None when the rent used this job's own speed
        on that machine, or stored none."""
        cost = self.chosen_cost
        spp, factor = cost.get("seconds_per_step"), cost.get("machine_speed_factor") or 1.0
        if cost.get("speed_source") == selection.SPEED_MACHINE or not spp or spp <= 0:
            return None
        return float(spp) / float(factor)

    @property
    def seconds_per_step(self) -> float | None:
        """The speed the rent expected on the chosen offer."""
        return self.chosen_cost.get("seconds_per_step") or None

    @property
    def steps_planned(self) -> int:
        """The steps the rent priced (the rest of the run when it was rented)."""
        return int(self.chosen_cost.get("steps_remaining") or 0)

    @property
    def upload_usd(self) -> float:
        """What uploading the priced steps' checkpoints was expected to cost."""
        return float(self.chosen_cost.get("upload_usd") or 0.0)

    def outbid_choice(
        self,
        *,
        machine_id: int | None,
        steps_left: int,
        seconds_per_step: float | None,
        bid_margin: float,
        new_min_bid: float | None,
        max_bid_dph: float | None,
        rates: selection.PreemptionRates,
    ) -> selection.OutbidChoice:
        """``selection.outbid_choice`` with the numbers this decision holds: the move is its
        best candidate on another machine than MACHINE_ID (its price, speed, rework without
        the half interval, which both sides redo alike, and rate), else this offer on demand;
        staying restarts the container and faces the rate of a bid at BID_MARGIN."""
        cost, gpu = self.chosen_cost, self.chosen_offer.get("gpu_name") or ""
        on_demand = self.chosen_offer.get("dph_base")
        stay_spp = seconds_per_step or cost.get("seconds_per_step") or 0.0
        move, move_price, move_spp, move_rate = self._move(machine_id, stay_spp, rates)
        redone_usd = (move.get("gpu_usd_per_hour") or 0.0) * (move.get("redo_h") or 0.0)
        caps = [c for c in (max_bid_dph, on_demand) if c]
        return selection.outbid_choice(
            steps_left=steps_left,
            stay_seconds_per_step=stay_spp,
            new_min_bid=new_min_bid,
            bid_margin=bid_margin,
            stay_outbids_per_h=rates.rate(selection.INTERRUPTIBLE, gpu, bid_margin)[0],
            restart_h=cost.get("container_start_h") or 0.0,
            cap_usd_per_hour=min(caps) if caps else None,
            move_usd_per_hour=move_price,
            move_seconds_per_step=move_spp,
            move_interruptions_per_h=move_rate,
            move_rework_usd=max((move.get("rework_usd") or 0.0) - redone_usd, 0.0),
        )

    def wait_or_move(
        self,
        *,
        machine_id: int | None,
        offline_s: float,
        cap_s: float,
        history: ReturnHistory,
        usd_per_hour: float,
        rates: selection.PreemptionRates,
    ) -> WaitOrMove:
        """``hosts.wait_or_move`` with the numbers this decision holds: waiting ends in a
        container restart on the same disk (the chosen offer's container start, nothing to
        pull or download); moving is the best candidate on another machine than MACHINE_ID
        (else this offer on demand): its rework after a loss without the detection (done
        already) and without the half interval redone (the same either way)."""
        restart_h = self.chosen_cost.get("container_start_h") or 0.0
        stay_spp = self.chosen_cost.get("seconds_per_step") or 0.0
        move, move_price, _, _ = self._move(machine_id, stay_spp, rates)
        redo_h = move.get("redo_h") or 0.0
        detection_h = selection.DETECTION_S / selection.SECONDS_PER_HOUR
        return wait_or_move(
            offline_s=offline_s,
            cap_s=cap_s,
            history=history,
            restart_h=restart_h,
            restart_usd=usd_per_hour * restart_h,
            move_h=max((move.get("rework_h") or 0.0) - redo_h - detection_h, 0.0),
            move_usd=max((move.get("rework_usd") or 0.0) - move_price * redo_h, 0.0),
            usd_per_hour=usd_per_hour,
        )

    def _move(
        self, machine_id: int | None, stay_spp: float, rates: selection.PreemptionRates
    ) -> tuple[Mapping[str, Any], float, float, float]:
        """(rental, $/h, s/step, interruptions/h) of moving: the best candidate on another
        machine than MACHINE_ID, else a machine like this one, on demand."""
        for candidate in map(_mapping, self.data.get("candidates") or []):
            rental = _mapping(candidate.get("rental"))
            if rental and _mapping(candidate.get("offer")).get("machine_id") != machine_id:
                spp = _mapping(candidate.get("cost")).get("seconds_per_step") or stay_spp
                rate = rental.get("preemptions_per_h") or 0.0
                return rental, rental["gpu_usd_per_hour"], spp, rate
        on_demand = self.chosen_offer.get("dph_base") or math.inf
        gpu = self.chosen_offer.get("gpu_name") or ""
        return self.chosen_rental, on_demand, stay_spp, rates.rate(selection.ON_DEMAND, gpu)[0]


@dataclass(frozen=True)
class RankedOffer:
    """One ranked candidate of a decision (``selection.Ranked.as_dict``, fresh or stored) read
    by name: the offer, how it would be rented and at what GPU $/h, the run without
    interruptions at that price (``cost``) and the expected total with them. A candidate
    stored before rentals were weighed reads as on-demand at the offer's price, with no
    interruptions priced."""

    data: Mapping[str, Any]

    @property
    def offer(self) -> Mapping[str, Any]:
        """The offer's deciding fields (``selection.offer_summary``)."""
        return _mapping(self.data.get("offer"))

    @property
    def cost(self) -> Mapping[str, Any]:
        """The run without interruptions at ``usd_per_hour`` (``selection.CostBreakdown``)."""
        return _mapping(self.data.get("cost"))

    @property
    def rental(self) -> Mapping[str, Any]:
        """How the offer would be rented (``selection.RentalCost``; empty when not stored)."""
        return _mapping(self.data.get("rental"))

    @property
    def rental_label(self) -> str:
        """ "on-demand" or "interruptible, min_bid +15 %"."""
        return str(_mapping(self.rental.get("rental")).get("label") or selection.ON_DEMAND)

    @property
    def usd_per_hour(self) -> float:
        """The GPU price the row was priced at: the bid, or the on-demand price."""
        price = self.rental.get("gpu_usd_per_hour")
        return float(price if price is not None else self.offer.get("dph_base") or 0.0)

    @property
    def expected_total_usd(self) -> float | None:
        """The run with its expected interruptions; None when they come faster than the work
        (stored as null: "never finishes")."""
        if not self.rental:
            return float(self.cost.get("total_usd") or 0.0)
        total = self.rental.get("expected_total_usd")
        return None if total is None else float(total)

    @property
    def start_risk_usd(self) -> float:
        """P(the start fails) x what a failed start costs, in the expected total (0 when the
        team's memory of machines did not price it: ``selection.RentalCost``)."""
        return float(self.rental.get("start_risk_usd") or 0.0)

    @property
    def memory_words(self) -> str:
        """What the team's memory says of the machine and adds to the total ("machine 48211:
        lost 2 of 3 rentals in 9 days (half-life 14 d): +$0.31 expected; never ready, ...",
        ``selection.MemoryNote``), the dollars by the money rule; "" for none."""
        memory = _mapping(self.data.get("memory"))
        if not memory.get("head"):
            return ""
        usd = memory.get("usd")
        added = "" if usd is None else ("+" if usd >= 0 else "") + money(usd)
        notes = tuple(str(n) for n in memory.get("notes") or ())
        return selection.memory_words(str(memory["head"]), notes, added)


def ranked_offers(decision: Mapping[str, Any]) -> tuple[RankedOffer, ...]:
    """DECISION's candidates (``selection.Decision.as_dict``), the chosen one first."""
    return tuple(RankedOffer(_mapping(c)) for c in decision.get("candidates") or [])


def offer_from_summary(summary: Mapping[str, Any]) -> Offer | None:
    """An offer as ``selection.offer_summary`` stored it (the fields a decision rests on; the
    rest unknown), or None for a summary without an id."""
    if not isinstance(summary.get("id"), int):
        return None
    known = {name: summary.get(name) for name in _SUMMARY_FIELDS}
    unknown = dict.fromkeys(_NOT_SUMMARISED)
    return Offer(
        **known,
        **unknown,
        gpu_name=str(summary.get("gpu_name") or ""),
        num_gpus=int(summary.get("num_gpus") or 1),
        verified=bool(summary.get("verified")),
        datacenter=bool(summary.get("datacenter")),
    )


_SUMMARY_FIELDS = (
    "id",
    "machine_id",
    "host_id",
    "dph_base",
    "dph_total",
    "storage_usd_per_gb_hour",
    "download_usd_per_gb",
    "upload_usd_per_gb",
    "inet_down_mbps",
    "inet_up_mbps",
    "reliability",
    "dlperf",
    "geolocation",
)


_NOT_SUMMARISED = (
    "gpu_ram_gb",
    "gpu_total_ram_gb",
    "cpu_cores_effective",
    "cpu_ram_gb",
    "disk_space_gb",
    "cuda_max_good",
    "compute_cap",
    "min_bid",
)


def page_decision(attempts: Iterable[Attempt]) -> Mapping[str, Any] | None:
    """The decision the job page shows: the newest stored among ATTEMPTS (oldest first)."""
    stored = [a.decision for a in attempts if a.decision]
    return stored[-1] if stored else None
