"""The acquisition bench's double-buy check: the product's offer claims on a real database.

``bench/acquisition.py`` calls ``double_buys`` after its simulation, in its own throwaway SQLite
database (migrated, as ``bench/recovery.py`` builds one). For each race, two jobs of one team are
planned in the same pass (``lifecycle.plan_rent``: two attempts) and both saw the same listing:
the race's racers, best first, then the rest of the ranking. Each rent claims its racers' offers
with ``jobs.renting.offer_claims.claim_offer`` (the call ``race_start.start_race`` makes before
a create), interleaved racer by racer, and takes the next offer of its listing when a claim is
refused. A create is counted for each claim granted; an offer is double-bought when two live
holders were granted it. Both jobs are then cancelled (their claims go stale, as the holders
end), and the next race claims on a database that keeps every earlier row.

What is *not* exercised here: concurrency between processes (SQLite serialises writers; the
claim's guard is the unique constraint of a live claim, ``tests/test_race_guards.py`` runs it
against the sandbox's double-sell) and the creates themselves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimRun:
    races: int
    creates: int
    refused: int
    double_bought: int


def double_buys(listings: list[tuple[int, list[int]]]) -> ClaimRun:
    """LISTINGS: per race, (k, the offer ids of its listing, best first). Django must be set up
    and migrated (``bench.recovery.configure`` then ``django.setup()``)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs import lifecycle
    from jobs.renting import offer_claims
    from nomadgpu.models import Team
    from tests.support.market import FIELD_REPORT_REQUIREMENTS

    team = Team.objects.create(name="acquisition", slug="acquisition")
    user = get_user_model().objects.create_user("acquisition")
    creates = refused = double = 0
    for number, (k, listing) in enumerate(listings):
        now = timezone.now()
        attempts = []
        for side in ("a", "b"):
            job = lifecycle.submit_job(
                team=team,
                created_by=user,
                now=now,
                name=f"race {number}{side}",
                image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
                command="true",
                env={},
                total_steps=300,
                requirements=FIELD_REPORT_REQUIREMENTS,
                profile={"image_gb": 3.6, "model_gb": 15.0, "upload_gb": 1.0},
            )
            attempt = job.attempts.order_by("-number").first() or lifecycle.plan_rent(
                job.pk, now=now
            )
            attempts.append(attempt)
        granted: Counter[int] = Counter()
        cursor = [0, 0]
        taken = [0, 0]
        # Racer by racer, the two rents alternate (the worst interleaving for a claim).
        while min(taken) < k and max(cursor) < len(listing):
            for side, attempt in enumerate(attempts):
                if taken[side] >= k or cursor[side] >= len(listing):
                    continue
                offer = listing[cursor[side]]
                cursor[side] += 1
                if offer_claims.claim_offer(offer, attempt=attempt, now=now):
                    granted[offer] += 1
                    taken[side] += 1
                else:
                    refused += 1
        creates += sum(granted.values())
        double += sum(1 for n in granted.values() if n > 1)
        for attempt in attempts:
            lifecycle.cancel_job(attempt.job_id, now=now, by="the bench")
    return ClaimRun(len(listings), creates, refused, double)
