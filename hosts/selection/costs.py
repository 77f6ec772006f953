"""The cost model: the expected total cost of the rest of a job on one offer, run without an
interruption (``estimate_cost``; ``rental_costs`` prices the interruptions in).

In the units of ``hosts.vast`` (GB = GiB = 1024³ bytes, the unit traffic is priced in;
bandwidth in Mbit/s; prices per hour / per GB / per GB-hour):

=================  ============================================================================
start-up           ``image_pull_h``     image size / inet_down (Vast state ``loading``), x (1 - the
                                        chance the machine kept the image: ``ImageCache``)
                   ``model_download_h`` model (+ checkpoint when resuming) / inet_down
                   ``container_start_h`` fixed overhead (``JobProfile.container_start_s``;
                   once measured, ``start_s``, which holds the command's downloads too)
training           ``train_h``          (steps_total - steps_done) * seconds per step
GPU                ``dph_base`` * (model download + container start + training)
storage            storage $/GB/h * ``Requirements.disk_gb`` * (start-up + training)
traffic            (image x (1 - that chance) + model [+ checkpoint]) GB * download $/GB
                   + upload_gb * remaining share of the run * upload $/GB
=================  ============================================================================

What start-up time is billed at the GPU rate (docs/vast-api.md §7): Vast bills the GPU from
``running`` on, not while ``loading`` — and ``loading`` is the image pull, so the pull costs
storage and traffic but no GPU time. The model download is done by our agent inside the
running container, so it IS billed GPU time (the field report's $0.81 first attempt: 15 GB
of model pulled over a metered link while the host was already billing). The container-start
overhead (agent start, imports, loading weights onto the GPU) also happens after ``running``
and is billed (docker's own few seconds of start belong to ``loading``; counting them too
errs on the dear side). Storage is billed from creation, so it covers the whole start-up.

Not modelled: checkpoint uploads overlap training (they cost traffic, not time); a host's link
is assumed to deliver its advertised ``inet_down``; the replacement host is priced like this one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hosts.selection.image_cache import NO_IMAGE_CACHE, ImageCache
from hosts.selection.profile import JobProfile
from hosts.selection.requirements import Requirements
from hosts.selection.speed import SpeedBook, seconds_per_step
from hosts.vast import Offer

BYTES_PER_GB = 1024**3  # traffic is priced per 1024³ bytes (hosts.vast, sandbox billing)
BITS_PER_MBIT = 1_000_000  # link speeds are decimal megabits
SECONDS_PER_HOUR = 3600.0


class CannotEstimate(ValueError):
    """The offer lacks what the cost model needs (a price, a bandwidth, any speed estimate)."""


@dataclass(frozen=True)
class CostBreakdown:
    """The expected cost of running the rest of the job on one offer (module docstring)."""

    offer_id: int
    seconds_per_step: float
    speed_source: str
    steps_remaining: int
    image_pull_h: float
    model_download_h: float
    container_start_h: float
    startup_h: float
    train_h: float
    gpu_billed_h: float  # start-up minus the image pull, plus training
    storage_billed_h: float  # start-up plus training
    download_gb: float
    upload_gb: float
    gpu_usd: float
    storage_usd: float
    download_usd: float
    upload_usd: float
    total_usd: float
    # The chance the machine still holds the job's image from an earlier rental (``ImageCache``):
    # the pull above is already (1 - this) x the whole pull.
    image_cached_chance: float = 0.0
    # The s/step above is the estimate times this: what the team's memory saw the machine do
    # against its promise (``SpeedBook.machine_factor``); 1 when it knows nothing.
    machine_speed_factor: float = 1.0

    @property
    def wall_h(self) -> float:
        """Hours from rent to the last step."""
        return self.startup_h + self.train_h

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def transfer_hours(gb: float, mbps: float) -> float:
    """Hours to move ``gb`` GiB over a link of ``mbps`` Mbit/s."""
    return gb * BYTES_PER_GB * 8 / (mbps * BITS_PER_MBIT) / SECONDS_PER_HOUR


def startup_hours(
    profile: JobProfile, mbps: float, *, resuming: bool
) -> tuple[float, float, float]:
    """(image pull, downloads on the GPU's time, container start) in hours at MBPS: the
    profile's sizes at that bandwidth and its typed start, or what was measured (its
    ``start_s`` holds the command's downloads; a resume's checkpoint still comes at MBPS)."""
    restore_gb = profile.checkpoint_gb if resuming else 0.0
    if profile.start_s is None:
        fetch_h = transfer_hours(profile.model_gb + restore_gb, mbps)
        start_h = profile.container_start_s / SECONDS_PER_HOUR
    else:
        fetch_h = transfer_hours(restore_gb, mbps)
        start_h = profile.start_s / SECONDS_PER_HOUR
    if profile.pull_s is None:
        return transfer_hours(profile.image_gb, mbps), fetch_h, start_h
    return profile.pull_s / SECONDS_PER_HOUR, fetch_h, start_h


def billing_inputs(offer: Offer) -> tuple[float, float, float, float, float]:
    """(GPU $/h, storage $/GB/h, download $/GB, upload $/GB, download Mbit/s) of OFFER;
    ``CannotEstimate`` when one is missing or the bandwidth is 0."""
    values = (
        offer.dph_base,
        offer.storage_usd_per_gb_hour,
        offer.download_usd_per_gb,
        offer.upload_usd_per_gb,
        offer.inet_down_mbps,
    )
    if any(v is None for v in values) or not offer.inet_down_mbps:
        raise CannotEstimate(f"offer {offer.id} lacks a price or its download bandwidth")
    return values  # type: ignore[return-value]


def estimate_cost(
    offer: Offer,
    profile: JobProfile,
    speeds: SpeedBook,
    req: Requirements,
    *,
    gpu_usd_per_hour: float | None = None,
    images: ImageCache = NO_IMAGE_CACHE,
) -> CostBreakdown:
    """Expected total cost of the rest of the job on ``offer`` (see the module docstring), with
    no interruption, at the offer's ``dph_base`` or at GPU_USD_PER_HOUR (a bid). On a machine
    that may still hold the image (IMAGES), the pull and its traffic are priced at (1 - that
    chance) of a whole pull: a host that kept the image starts the container at once.

    Raises ``CannotEstimate`` for an offer without prices, bandwidth or a speed estimate;
    ``filter_offers`` and ``rank_offers`` keep such offers out.
    """
    speed = seconds_per_step(offer, profile, speeds)
    if speed is None:
        raise CannotEstimate(f"offer {offer.id}: no speed estimate for {offer.gpu_name!r}")
    factor = speeds.machine_factor(offer.machine_id, speed[1])
    speed = (speed[0] * factor, speed[1])
    dph, storage, down_price, up_price, mbps = billing_inputs(offer)
    if gpu_usd_per_hour is not None:
        dph = gpu_usd_per_hour
    fetched_gb = profile.model_gb + (profile.checkpoint_gb if profile.steps_done > 0 else 0.0)
    image_h, model_h, start_h = startup_hours(profile, mbps, resuming=profile.steps_done > 0)
    cached = images.chance(offer.machine_id)
    image_h *= 1.0 - cached
    train_h = profile.steps_remaining * speed[0] / SECONDS_PER_HOUR
    # Vast bills the GPU from `running` on: the image pull (`loading`) is not GPU time
    # (docs/vast-api.md §7).
    gpu_h = model_h + start_h + train_h
    down_gb = profile.image_gb * (1.0 - cached) + fetched_gb
    up_gb = profile.upload_gb * profile.share_remaining
    usd = {
        "gpu_usd": dph * gpu_h,
        "storage_usd": storage * req.disk_gb * (image_h + gpu_h),
        "download_usd": down_gb * down_price,
        "upload_usd": up_gb * up_price,
    }
    return CostBreakdown(
        offer_id=offer.id,
        seconds_per_step=speed[0],
        speed_source=speed[1],
        steps_remaining=profile.steps_remaining,
        image_pull_h=image_h,
        model_download_h=model_h,
        container_start_h=start_h,
        startup_h=image_h + model_h + start_h,
        train_h=train_h,
        gpu_billed_h=gpu_h,
        storage_billed_h=image_h + gpu_h,
        download_gb=down_gb,
        upload_gb=up_gb,
        **usd,
        total_usd=sum(usd.values()),
        image_cached_chance=cached,
        machine_speed_factor=factor,
    )
