"""Which machines already hold a job's image, and the chance they still do, from the team's
attempts: what the selection prices a machine's pull with (``hosts.selection.ImageCache``).

A machine pulled image I when an attempt of a team job with image I came up on it (its
container started: ``container_started_at``, else the agent's first call). Vast hosts keep image
layers in their Docker between rentals, while an instance's own disk goes with it
(``sandbox/image_cache.py`` cites both), so a later rental of that machine starts without
the pull unless the host wiped it meanwhile. Which of the two happened is read from that later
rental's own pull (rent to container up): it **found the image** when the pull took less than
the machine's last whole pull minus half the image's transfer at the offer's bandwidth (half
of the whole pull when the size or bandwidth is unknown), else the host **wiped** it and that
pull is the new whole one.

The chance a machine still holds it (``chance_image_kept``): its own later rentals (found /
all), weighed with ``MACHINE_WEIGHT`` rentals of the team's rate; the team's rate is every
machine's later rentals of the image, weighed with ``PRIOR_WEIGHT`` rentals of the prior; the
prior is ``PRIOR_KEPT``, a guess (how often Vast hosts prune images is not published).
Only the image: no new instance finds the model or a checkpoint on a machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F
from django.db.models.functions import Coalesce

from hosts import selection
from jobs.models import Attempt

# Not published (no Vast page says how often hosts prune images): a guess, the same as the
# sandbox's one wipe in five rentals (sandbox/image_cache.py, GUESSED_WIPE_CHANCE).
PRIOR_KEPT = 0.8
PRIOR_WEIGHT = 5.0  # later rentals the prior counts as, against the team's
MACHINE_WEIGHT = 2.0  # later rentals the team's rate counts as, against one machine's
HISTORY_PULLS = 500  # the newest pulls of the image read
BITS_PER_BYTE = 8


@dataclass(frozen=True)
class Pull:
    """One attempt that came up on a machine with the image: how long from rent to container
    up, and how long the image alone would take at that offer's bandwidth (None: unknown)."""

    machine_id: int
    at: datetime
    seconds: float
    transfer_s: float | None = None
    attempt_id: int | None = None


@dataclass(frozen=True)
class Outcomes:
    """Of a machine's rentals after its first pull: how many found the image there."""

    later: int = 0
    found: int = 0


def pulls_of(team_id: int, image: str) -> list[Pull]:
    """The team's attempts that came up on a known machine with IMAGE, oldest first."""
    rows = (
        Attempt.objects.filter(job__team_id=team_id, job__image=image, rented_at__isnull=False)
        .exclude(machine_id=None)
        .annotate(up=Coalesce(F("container_started_at"), F("registered_at")))
        .exclude(up=None)
        .order_by("-rented_at")
        .values_list(
            "id",
            "machine_id",
            "rented_at",
            "up",
            "job__profile__image_gb",
            "decision__chosen__offer__inet_down_mbps",
        )[:HISTORY_PULLS]
    )
    return [_pull(*row) for row in reversed(list(rows))]


def _pull(attempt_id, machine, rented, up, image_gb, mbps) -> Pull:
    transfer = None
    if _positive(image_gb) and _positive(mbps):
        transfer = float(image_gb) * selection.BYTES_PER_GB * BITS_PER_BYTE / (float(mbps) * 1e6)
    seconds = max((up - rented).total_seconds(), 0.0)
    return Pull(int(machine), rented, seconds, transfer, attempt_id)


def _positive(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def found_the_image(pull: Pull, whole: Pull) -> bool:
    """Whether PULL, a later rental of WHOLE's machine, found the image there: its pull was
    shorter than WHOLE's by at least half the image's transfer (half WHOLE when unknown)."""
    saved = pull.transfer_s if pull.transfer_s is not None else whole.seconds
    return pull.seconds <= whole.seconds - saved / 2


def read_pulls(pulls: Iterable[Pull]) -> Iterator[tuple[Pull, bool | None]]:
    """Each of PULLS (oldest first) with whether it found the image on its machine: None for a
    machine's first, False for one that pulled it whole (the new reference for the next)."""
    whole: dict[int, Pull] = {}
    for pull in pulls:
        first = whole.get(pull.machine_id)
        found = None if first is None else found_the_image(pull, first)
        if not found:
            whole[pull.machine_id] = pull
        yield pull, found


def outcomes_by_machine(pulls: Iterable[Pull]) -> dict[int, Outcomes]:
    """Per machine that pulled the image: its later rentals and how many found it (PULLS
    oldest first). A rental that did not find it pulled it whole again."""
    counts: dict[int, list[int]] = {}
    for pull, found in read_pulls(pulls):
        seen = counts.setdefault(pull.machine_id, [0, 0])
        if found is not None:
            seen[0] += 1
            seen[1] += int(found)
    return {machine: Outcomes(later, found) for machine, (later, found) in counts.items()}


def attempts_that_found_the_image(team_id: int, image: str) -> frozenset[int]:
    """The team's attempts whose machine held IMAGE from an earlier rental: their pull was no
    pull, so the measured start-up leaves them out
    (``jobs.renting.shape_history.measured_startup``)."""
    if not image:
        return frozenset()
    pulls = read_pulls(pulls_of(team_id, image))
    return frozenset(p.attempt_id for p, found in pulls if found and p.attempt_id is not None)


def team_rate(outcomes: Iterable[Outcomes]) -> float:
    """The share of the team's later rentals that found the image, weighed with the prior."""
    later = found = 0
    for o in outcomes:
        later, found = later + o.later, found + o.found
    return (found + PRIOR_WEIGHT * PRIOR_KEPT) / (later + PRIOR_WEIGHT)


def chance_image_kept(machine: Outcomes, team: float) -> float:
    """The chance a machine that pulled the image still holds it: its own later rentals,
    weighed with ``MACHINE_WEIGHT`` rentals at the team's rate TEAM (``team_rate``)."""
    return (machine.found + MACHINE_WEIGHT * team) / (machine.later + MACHINE_WEIGHT)


def kept_words(machine: Outcomes, chance: float) -> str:
    """Where a machine's chance comes from, for the page."""
    if machine.later:
        return f"{chance:.0%}: found on {machine.found} of {machine.later} later rentals here"
    return f"{chance:.0%}: pulled here before; the team's rate, else a guessed {PRIOR_KEPT:.0%}"


def image_cached_odds(team_id: int, image: str) -> selection.ImageCache:
    """For each machine the team's attempts pulled IMAGE on, the chance it still holds it."""
    outcomes = outcomes_by_machine(pulls_of(team_id, image))
    team = team_rate(outcomes.values())
    chances = {m: chance_image_kept(o, team) for m, o in outcomes.items()}
    words = {m: kept_words(outcomes[m], c) for m, c in chances.items()}
    return selection.ImageCache(by_machine=chances, words=words)
