"""The image pull an attempt is recorded with: the bytes the host's Docker downloaded before
the container, and so the agent's counters, started (``recorded_pull``).

Vast bills every byte each way, the pull included (``docs/vast-api.md`` §7). Which source
wins, in this order (what is measured over what is assumed):

1. **Measured.** Nothing measures the pull's bytes, and it is said here so that nobody looks
   again: the container's counters (``/proc/net/dev``, read by the agent) belong to the
   container's own network namespace, created with the container after the host's Docker
   daemon pulled the image, and the bootstrap runs inside it; Vast's instance fields
   ``inet_down_billed``/``inet_up_billed`` are undocumented, and third parties disagree on
   their unit (``docs/vast-api.md`` §4 and §10.4: "do not use for money"); the sandbox serves
   neither. The invoice's ``bwd`` item is the one measurement, and once imported it replaces
   the record as the job's cost (``billing.cost``).
2. **The host's own words.** Whether the pull happened the host does say: Vast relays
   Docker's pull output in ``status_msg`` while the instance loads, "Status: Image is up to
   date for IMAGE" when it held the image, "Downloading", "Pull complete" and the like while it
   pulls (``hosts.vast.image_pull_seen``). What the poll first read of them
   (``Attempt.provider_pull_seen``) wins over everything below: the whole pull for "pulled",
   none for "kept", even on a machine the team never used (another renter's pull). A load
   shorter than a poll interval may show none of them; then the rules below decide.
3. **A machine that never ran the image for the team** pulled it whole: the rent found no
   attempt of the team that came up on that machine with that image (``image_cached_chance``
   0 in the rent decision: ``jobs.renting.image_cache``). The whole pull is the profile's
   ``image_gb`` as priced at the rent, counted from the rent, as Vast bills it while it loads.
   (Vast hosts also cache common layers from other renters, so such a pull may be smaller;
   without Docker's words nothing tells us, and reconciliation shows the difference.)
4. **A machine that held it** (chance above 0): its own start tells whether the host kept the
   image. Vast shows ``loading`` while it pulls the image and starts the container (§4); a
   host that kept the image loads in a container start, seconds. The pull is counted when the
   provider poll read the instance ``loading`` for at least half the image's transfer at the
   offer's bandwidth (``shows_a_pull``): from its first ``loading`` read to the container's
   start (or the attempt's end, or now while it still loads). A load the poll never read, or a
   shorter one, was no pull: the image was on the machine, and nothing is recorded for it.
   The poll reads every ``PROVIDER_POLL_INTERVAL_S`` (10 s), so an image whose half transfer
   is shorter than that may hide its pull; that is a small image, and the invoice tells.
   Not the rent to the container's start: before ``loading`` Vast schedules the contract
   (``created``), 1-5 minutes (``sandbox/timing.py`` cites the sources), longer than most
   pulls, so that span cannot tell a pull from a slow schedule; ``loading`` holds only the
   pull and the container start.

No rent decision (an instance adopted by its label, a row made by hand): no image was priced,
so no pull is recorded, whatever was read.

A sandbox run with ``--fast`` or ``--time-scale`` shortens its pulls, not the real transfer
times rule 4 compares with, so there a machine that held the image reads as having kept it
unless the poll read Docker's words; under ``--fast`` the sandbox never wipes an image
(``sandbox/image_cache.py``), so that is also what happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from hosts.vast import IMAGE_KEPT, IMAGE_PULLED
from jobs.rent_decision import RentDecision

GB = 1024**3
BITS_PER_BYTE = 8

NO_DECISION = "no image priced at the rent"
SAID_PULLED = "pulled: the host's Docker said so while it loaded"
SAID_KEPT = "no pull: the host's Docker said the image was up to date"
NEVER_ON_MACHINE = "pulled: the machine had not run the image for the team"
LOADED_LONG = "pulled: the host loaded long enough to pull the image"
KEPT = "no pull: the image was on the machine"


@dataclass(frozen=True)
class Pull:
    """The image pull recorded for one attempt: its bytes and why (``recorded_pull``)."""

    bytes: int
    why: str


def transfer_seconds(image_gb: float, mbps: float | None) -> float | None:
    """Seconds to move IMAGE_GB GiB over a link of MBPS Mbit/s (None when unknown)."""
    if not mbps or mbps <= 0:
        return None
    return image_gb * GB * BITS_PER_BYTE / (mbps * 1e6)


def loading_seconds(attempt, *, now: datetime) -> float:
    """Seconds the poll saw ATTEMPT's instance loading: from its first ``loading`` read to the
    container's start (else the poll's first ``running`` read, the agent's first call, the
    attempt's end, or NOW while it loads); 0 when it never read one."""
    if attempt.provider_loading_at is None:
        return 0.0
    end = (
        attempt.container_started_at
        or attempt.provider_running_at
        or attempt.registered_at
        or attempt.ended_at
        or now
    )
    return max((end - attempt.provider_loading_at).total_seconds(), 0.0)


def shows_a_pull(loading_s: float, transfer_s: float | None) -> bool:
    """Whether a load of LOADING_S seconds pulled an image that takes TRANSFER_S to move: it
    lasted at least half of that (a kept image loads in a container start). Without a known
    transfer time only a load of a whole poll interval or more can tell, and none is assumed."""
    return transfer_s is not None and loading_s >= transfer_s / 2


def recorded_pull(attempt, *, now: datetime) -> Pull:
    """The image pull recorded for ATTEMPT as of NOW, by the rules in the module docstring."""
    decision = RentDecision.of(attempt)
    image_gb = decision.image_gb
    if image_gb <= 0:
        return Pull(0, NO_DECISION)
    whole = int(image_gb * GB)
    if attempt.provider_pull_seen == IMAGE_PULLED:
        return Pull(whole, SAID_PULLED)
    if attempt.provider_pull_seen == IMAGE_KEPT:
        return Pull(0, SAID_KEPT)
    if not decision.chosen_cost.get("image_cached_chance"):
        return Pull(whole, NEVER_ON_MACHINE)
    transfer_s = transfer_seconds(image_gb, decision.chosen_offer.get("inet_down_mbps"))
    if shows_a_pull(loading_seconds(attempt, now=now), transfer_s):
        return Pull(whole, LOADED_LONG)
    return Pull(0, KEPT)
