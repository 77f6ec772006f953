"""The reference host: what a job is priced on before any market search (the budget's
pre-flight and rent reservation, ``billing.services``, through ``estimate_for``): the offers
the shape's newest rent weighed, priced again with what is measured now, else the typed
reference GPU at ``BUDGET_ESTIMATE_DPH`` per GPU.
"""

from __future__ import annotations

from dataclasses import replace

from django.conf import settings

from hosts import selection
from hosts.vast import Offer
from jobs.models import Job
from jobs.rent_decision import RentDecision
from jobs.renting import measures, shape_history
from jobs.renting.terms import profile_for, requirements_for

REFERENCE_STORAGE_USD_PER_GB_MONTH = 0.15


HOURS_PER_MONTH = 720


def reference_offer(
    req: selection.Requirements,
    profile: selection.JobProfile,
    paid: measures.HostPaid | None = None,
) -> Offer:
    """The host a job is priced on before any market search: submitting must not depend on
    the provider answering, and the cheapest host is not known until the rent. Once the job's
    shape was rented (PAID, ``measures.HostPaid``): the GPU model its rents got most, at the
    median rates they paid. Before: REQ's number of the profile's reference GPU at
    ``BUDGET_ESTIMATE_DPH`` $/h each (default 0.40, an RTX 4090 at the field report's prices),
    storage at $0.15/GB/month, free traffic. REQ's minimum bandwidth either way; it takes no
    bid, so it is rented on demand whatever REQ's rental (at the bid, when PAID was one)."""
    offer = _typed_reference_offer(req, profile)
    if paid is None:
        return offer
    return replace(
        offer,
        gpu_name=paid.gpu_name,
        dph_base=paid.dph,
        storage_usd_per_gb_hour=paid.storage_usd_per_gb_hour,
        download_usd_per_gb=paid.download_usd_per_gb,
        upload_usd_per_gb=paid.upload_usd_per_gb,
    )


def _typed_reference_offer(req: selection.Requirements, profile: selection.JobProfile) -> Offer:
    return Offer(
        id=0,
        machine_id=None,
        host_id=None,
        gpu_name=profile.reference_gpu,
        num_gpus=req.num_gpus,
        gpu_ram_gb=None,
        gpu_total_ram_gb=None,
        cpu_cores_effective=None,
        cpu_ram_gb=None,
        disk_space_gb=None,
        cuda_max_good=None,
        compute_cap=None,
        dph_base=float(settings.BUDGET_ESTIMATE_DPH) * req.num_gpus,
        dph_total=None,
        min_bid=None,
        storage_usd_per_gb_hour=REFERENCE_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH,
        download_usd_per_gb=0.0,
        upload_usd_per_gb=0.0,
        inet_down_mbps=req.min_inet_down_mbps or 500.0,
        inet_up_mbps=None,
        reliability=1.0,
        verified=True,
        datacenter=False,
        dlperf=None,
        geolocation=None,
    )


def reference_cost(
    req: selection.Requirements,
    profile: selection.JobProfile,
    history: measures.History = measures.NO_HISTORY,
) -> selection.CostBreakdown:
    """The selection's cost model for the rest of the job before any market search: on the
    offers HISTORY's newest rent weighed, priced again with PROFILE (what is measured now
    may rank them differently: a shape found to train fast no longer pays a metered link for
    a cheaper GPU), the cheapest; without any, on ``reference_offer``."""
    weighed = _weighed_costs(req, profile, history)
    if weighed:
        return min(weighed, key=lambda cost: cost.total_usd)
    return _reference_offer_cost(req, profile, history)


def _weighed_costs(
    req: selection.Requirements, profile: selection.JobProfile, history: measures.History
) -> list[selection.CostBreakdown]:
    weighed = RentDecision(history.last_decision).weighed_offers(req)
    book = history.speeds.book()
    book = replace(
        book, by_model={profile.reference_gpu: profile.reference_seconds_per_step, **book.by_model}
    ).with_market([offer for offer, _ in weighed], req.num_gpus)
    costs = []
    for offer, price in weighed:
        try:
            costs.append(selection.estimate_cost(offer, profile, book, req, gpu_usd_per_hour=price))
        except selection.CannotEstimate:
            continue  # stored without a price or a speed estimate: not a host to price on
    return costs


def _reference_offer_cost(
    req: selection.Requirements, profile: selection.JobProfile, history: measures.History
) -> selection.CostBreakdown:
    by_model = {profile.reference_gpu: profile.reference_seconds_per_step}
    offer = reference_offer(req, profile, history.host)
    if offer.gpu_name not in by_model:
        spp = history.speeds.reference(offer.gpu_name or "")
        if spp is None:  # rented, but never timed there: its price at the reference's speed
            offer = replace(offer, gpu_name=profile.reference_gpu)
        else:
            by_model[offer.gpu_name] = spp
    speeds = selection.SpeedBook(by_model=by_model)
    return selection.estimate_cost(offer, profile, speeds, req)


def estimate_for(job: Job) -> selection.CostBreakdown:
    """The rest of JOB on the reference host, with what its shape measured (the budget's
    pre-flight, reservation and projection). Raises ``StoredSpecInvalid``."""
    history = shape_history.history_for(job)
    return reference_cost(requirements_for(job), profile_for(job, history), history)
