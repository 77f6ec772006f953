"""The team's market: a client of the team's Vast account, and the one search every renter of
offers makes (the rent, the offers preview, the submit's checks).

Vast filters server-side on what its query language can say (``selection.vast_query``), and
the rest of the requirements are checked on the offers it returns (``selection.filter_offers``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from hosts import selection
from hosts.vast import Offer, VastClient


@contextmanager
def team_client(
    team: Any, *, client: VastClient | None = None, **kwargs: Any
) -> Iterator[VastClient]:
    """CLIENT when one is given (its owner closes it), else a client of TEAM's Vast account
    (``VastClient.from_settings`` with KWARGS, e.g. a retry policy), closed on the way out."""
    if client is not None:
        yield client
        return
    with VastClient.from_settings(team, **kwargs) as own:
        yield own


def search_offers(client: VastClient, req: selection.Requirements) -> list[Offer]:
    """The offers on CLIENT's market for REQ: Vast's own filter (``selection.vast_query``), at
    most ``selection.SEARCH_LIMIT`` of them, priced with REQ's disk. Raises ``VastError``."""
    return client.search_offers(
        selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
    )


def machine_ids(offers: Iterable[Offer]) -> list[int]:
    """The machines behind OFFERS (those that say which), for the team's memory of them."""
    return sorted({o.machine_id for o in offers if o.machine_id is not None})
