"""Why a spec can never be rented now, asked of the team's market at submit: an interruptible
rental no offer takes a bid for, or more GPUs on one host than any offer has."""

from __future__ import annotations

import logging
from typing import Any

from hosts import selection
from hosts.vast import VastClient, VastError
from jobs.renting import market
from jobs.renting.terms import requirements_from_spec
from jobs.spec import JobSpec
from portal.figures.offers import PREVIEW_RETRY

logger = logging.getLogger(__name__)


def interruptible_blocker(spec: JobSpec, *, team, client: VastClient | None = None) -> str | None:
    """For a spec that asks for ``rental: interruptible``: why no offer meeting its
    requirements can be bid on now (none has a ``min_bid``, or none under its
    ``max_bid_dph``), else None. A marketplace that cannot be asked, or has no matching offer
    at all, says nothing here: the rent searches again, as for any job."""
    req = requirements_from_spec(spec.requirements)
    if req.rental != selection.INTERRUPTIBLE:
        return None
    try:
        with market.team_client(team, client=client, retry=PREVIEW_RETRY) as vast:
            offers = market.search_offers(vast, req)
    except VastError:
        return None
    kept, _ = selection.filter_offers(offers, req)
    if not kept or any(selection.rentals_to_weigh(offer, req) for offer in kept):
        return None
    cap = f" at or under ${req.max_bid_dph}/h" if req.max_bid_dph else ""
    return (
        f"rental is interruptible, but none of the {len(kept)} offers that meet the "
        f"requirements takes a bid{cap}; ask for rental auto or on-demand, or raise max_bid_dph"
    )


def gpu_count_blocker(spec: JobSpec, *, team, client: VastClient | None = None) -> str | None:
    """Why SPEC's ``requirements.num_gpus`` can never be rented: no offer on TEAM's market has
    that many GPUs of its models on one host (the largest offer is asked for: Vast's query
    ordered by ``num_gpus``, one offer), else None. One GPU is never refused (and costs no
    search). A market that cannot be asked, or has no offer of the models at all, refuses
    nothing: the provider being briefly unreachable must not fail a submit, and the rent
    searches again and says "no offer" as for any job. Only the GPU model and the verified
    rule narrow the search: the other requirements are the rent's to weigh."""
    req = requirements_from_spec(spec.requirements)
    if req.num_gpus <= 1:
        return None
    query: dict[str, Any] = {"verified": {"eq": True} if req.verified_only else None}
    if req.gpu_names:
        names = list(req.gpu_names)
        query["gpu_name"] = {"eq": names[0]} if len(names) == 1 else {"in": names}
    try:
        with market.team_client(team, client=client, retry=PREVIEW_RETRY) as vast:
            largest = vast.search_offers(query, order=[["num_gpus", "desc"]], limit=1)
    except VastError as exc:
        logger.info("GPU count check skipped for team %s: %s", getattr(team, "slug", team), exc)
        return None
    if not largest or largest[0].num_gpus >= req.num_gpus:
        return None
    models = " or ".join(req.gpu_names) if req.gpu_names else "any model"
    return (
        f"no offer has {req.num_gpus} GPUs of {models} on one host; the most is "
        f"{largest[0].num_gpus}: lower requirements.num_gpus"
    )
