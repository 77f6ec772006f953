"""Offers before submit (and the rent's stored candidates): the offers table, each row priced
the way it would be rented, and the preview of the best offers for a spec now."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from hosts import selection
from hosts.models import MachineRental
from hosts.vast import RetryPolicy, VastClient, VastError
from jobs import rent_decision
from jobs.rent_decision import RankedOffer
from jobs.renting import corrections, image_cache, market
from jobs.renting.terms import profile_from_spec, requirements_from_spec
from jobs.spec import JobSpec
from nomadgpu.humanize import instance_price, money
from portal.figures.estimates import spec_history

logger = logging.getLogger(__name__)

PREVIEW_TOP_N = 5
# The offers preview runs while the member waits: fail fast instead of retrying for a minute.
PREVIEW_RETRY = RetryPolicy(attempts=2, base_delay=0.2, max_delay=1.0, max_server_wait=2.0)


@dataclass(frozen=True)
class OfferRow:
    """One row of an offers table, priced the way it would be rented. Its columns multiply
    out and add up: ``gpu_usd`` is ``usd_per_hour`` x ``train_h``, ``startup_usd`` the same
    price over the GPU-billed start-up (model download, container start; the image pull is
    not GPU time), and ``total_usd`` the sum of every dollar column (None: interruptions come
    faster than the work, so the run never finishes). ``start_risk_usd`` is the chance the
    start fails times what that costs, priced with the team's memory of machines."""

    rank: int
    num_gpus: int
    gpu_name: str
    datacenter: bool
    rental: str
    usd_per_hour: float
    inet_down_mbps: float | None
    reliability: float | None
    where: str
    train_h: float
    startup_gpu_h: float
    storage_usd: float
    download_usd: float
    upload_usd: float
    interruptions_usd: float | None
    # The chance the machine still holds the job's image from an earlier rental of the team
    # (``jobs.renting.image_cache``); its pull is priced at the rest. 0: it never pulled it.
    image_cached_chance: float = 0.0
    machine_id: int | None = None
    # P(the start fails) x what a failed start costs (``selection.failed_start``), and what the
    # team's memory of the machine says and adds ("" when it has no record of it).
    start_risk_usd: float = 0.0
    memory_words: str = ""

    @property
    def image_cached_text(self) -> str:
        """ "image cached (80 %)" for a machine that pulled the image before, else ""."""
        if self.image_cached_chance <= 0:
            return ""
        return f"image cached ({round(self.image_cached_chance * 100)} %)"

    @property
    def gpu_usd(self) -> float:
        """Training's GPU time at the row's price."""
        return self.usd_per_hour * self.train_h

    @property
    def startup_usd(self) -> float:
        """The start-up's GPU time at the row's price."""
        return self.usd_per_hour * self.startup_gpu_h

    @property
    def total_usd(self) -> float | None:
        """The sum of the row's dollar columns, interruptions included."""
        if self.interruptions_usd is None:
            return None
        parts = (self.gpu_usd, self.startup_usd, self.storage_usd, self.download_usd)
        return sum(parts) + self.upload_usd + self.start_risk_usd + self.interruptions_usd

    @property
    def texts(self) -> dict[str, str]:
        """Every amount as ``nomadgpu.humanize.money`` writes it, by column."""
        amounts = {
            "gpu": self.gpu_usd,
            "startup": self.startup_usd,
            "storage": self.storage_usd,
            "download": self.download_usd,
            "upload": self.upload_usd,
            "start_risk": self.start_risk_usd,
            "interruptions": self.interruptions_usd,
            "total": self.total_usd,
        }
        out = {k: "never finishes" if v is None else money(v) for k, v in amounts.items()}
        # The instance's price for all its GPUs, its per-GPU price beside it for several.
        return {**out, "usd_per_hour": instance_price(self.usd_per_hour, self.num_gpus)}


def offer_row(rank: int, candidate: RankedOffer) -> OfferRow:
    """CANDIDATE as row RANK: its columns at the price it would be rented at."""
    offer, cost, price = candidate.offer, candidate.cost, candidate.usd_per_hour
    train_h = float(cost.get("train_h") or 0.0)
    base = float(cost.get("total_usd") or 0.0)
    expected = candidate.expected_total_usd
    risk = candidate.start_risk_usd
    return OfferRow(
        rank=rank,
        num_gpus=int(offer.get("num_gpus") or 1),
        gpu_name=str(offer.get("gpu_name") or "GPU"),
        datacenter=bool(offer.get("datacenter")),
        rental=candidate.rental_label,
        usd_per_hour=price,
        inet_down_mbps=offer.get("inet_down_mbps"),
        reliability=offer.get("reliability"),
        where=offer.get("geolocation") or "—",
        train_h=train_h,
        startup_gpu_h=max(_gpu_billed_h(cost, price) - train_h, 0.0),
        storage_usd=float(cost.get("storage_usd") or 0.0),
        download_usd=float(cost.get("download_usd") or 0.0),
        upload_usd=float(cost.get("upload_usd") or 0.0),
        interruptions_usd=None if expected is None else max(expected - base - risk, 0.0),
        image_cached_chance=float(cost.get("image_cached_chance") or 0.0),
        machine_id=offer.get("machine_id"),
        start_risk_usd=risk,
        memory_words=candidate.memory_words,
    )


def _gpu_billed_h(cost: Mapping[str, Any], usd_per_hour: float) -> float:
    # Stored before the billed hours were kept: what the stored GPU dollars bought.
    if cost.get("gpu_billed_h") is not None:
        return float(cost["gpu_billed_h"])
    gpu_usd = float(cost.get("gpu_usd") or 0.0)
    return gpu_usd / usd_per_hour if usd_per_hour else float(cost.get("train_h") or 0.0)


def offer_rows(decision: Mapping[str, Any] | None) -> list[OfferRow]:
    """DECISION's candidates (``selection.Decision.as_dict``, fresh or stored on an attempt)
    as offers-table rows, the one it rents first."""
    if not decision:
        return []
    return [offer_row(n, c) for n, c in enumerate(rent_decision.ranked_offers(decision), 1)]


@dataclass
class OffersPreview:
    """The best offers for a spec now, or why there are none. The headline is the first
    row's total: the cost of the row it would rent."""

    rows: list[OfferRow] = field(default_factory=list)
    offers_seen: int = 0
    error: str = ""
    safer: str = ""  # why the first row is a safer runner-up (``selection.ranking.safer_pick``)

    @property
    def chosen(self) -> OfferRow | None:
        """The row it would rent."""
        return self.rows[0] if self.rows else None

    @property
    def estimated_total_usd(self) -> float | None:
        """The estimated cost of the job: the chosen row's total."""
        return self.chosen.total_usd if self.chosen else None


def preview_offers(spec: JobSpec, *, team, client: VastClient | None = None) -> OffersPreview:
    """The top offers for SPEC on TEAM's marketplace now, with the cost of the whole job."""
    req = requirements_from_spec(spec.requirements)
    history = spec_history(spec, team=team)
    profile = corrections.corrected_profile(
        profile_from_spec(spec.profile, steps_total=spec.total_steps or 0), history
    )
    try:
        with market.team_client(team, client=client, retry=PREVIEW_RETRY) as vast:
            offers = market.search_offers(vast, req)
    except VastError as exc:
        logger.info("offers preview failed for team %s: %s", getattr(team, "slug", team), exc)
        return OffersPreview(error=f"The marketplace could not be asked for offers: {exc}")
    speeds = history.speeds.book()
    images = image_cache.image_cached_odds(team.pk, spec.image)
    memory = MachineRental.objects.memory(
        now=timezone.now(), machine_ids=market.machine_ids(offers)
    )
    decision = selection.choose_offer(
        offers, req, profile, speeds, top_n=PREVIEW_TOP_N, images=images, memory=memory
    )
    if decision is None:
        return OffersPreview(
            offers_seen=len(offers), error="No offer on the market matches these requirements now."
        )
    data = decision.as_dict()
    return OffersPreview(
        rows=offer_rows(data), offers_seen=data["offers_seen"], safer=data["safer_pick"]
    )
