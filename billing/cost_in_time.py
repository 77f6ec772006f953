"""Costs over time, by the one cost rule (``billing.cost``): a job's cost at moments since its
submit (the job page's spend chart) and a team's cost in a period (the dashboard's "Spend this
month").

Each attempt counts at the figure ``billing.cost.cost_of`` gives it, recorded or invoiced,
spread over time like its recorded spend: a recorded attempt as ``billing.spend`` clips it
(GPU and storage by the time they ran in each stretch, traffic by the share of the attempt's
life); an invoiced one at its charges, in the proportion its recorded spend fell in each
stretch (evenly over its life when nothing was recorded), since Vast's daily charges say
nothing finer. So a job's chart ends at the job's cost, and a month holding a job's whole
life shows that job's cost; a job across two months counts in both for its time in each.

The spending limits do not read these: they count what NomadGPU recorded, clipped to their
periods (``billing.services``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from billing.cost import (
    INVOICED,
    PARTLY_INVOICED,
    PARTS,
    RECORDED,
    JobCost,
    charges_prefetch,
    covered_until,
    invoiced_attempts,
    invoiced_parts,
)
from billing.spend import Spend, attempt_spend, attempt_spend_between
from jobs.models import Attempt

MICRO = Decimal("0.000001")


def _life_share(attempt, lo: datetime, hi: datetime, *, now: datetime) -> float:
    """The share of ATTEMPT's life (rent to end, or NOW) inside [LO, HI)."""
    end = min(attempt.ended_at, now) if attempt.ended_at else now
    life = (end - attempt.rented_at).total_seconds()
    if life <= 0:
        return 1.0 if lo <= attempt.rented_at < hi else 0.0
    inside = (min(end, hi) - max(attempt.rented_at, lo)).total_seconds()
    return max(inside, 0.0) / life


def stretch_share(attempt, lo: datetime, hi: datetime, *, now: datetime) -> Decimal:
    """The share of ATTEMPT's cost that falls in [LO, HI) as seen at NOW: the part of its
    recorded spend there (of its life there, when nothing was recorded); module docstring."""
    whole = attempt_spend(attempt, now=now).total
    if whole > 0:
        share = attempt_spend_between(attempt, lo, hi, now=now).total / whole
    else:
        share = _life_share(attempt, lo, hi, now=now)
    return Decimal(str(min(max(share, 0.0), 1.0)))


def cost_between(
    attempts: Iterable, lo: datetime, hi: datetime, *, now: datetime, covered: datetime | None
) -> JobCost:
    """What ATTEMPTS (of one job, or of several: grouped by job for the invoice rule) cost in
    [LO, HI) as seen at NOW, the invoice reaching COVERED (module docstring)."""
    by_job: dict[int, list] = {}
    for attempt in attempts:
        if attempt.rented_at is not None:
            by_job.setdefault(attempt.job_id, []).append(attempt)
    invoiced = dict.fromkeys(PARTS, Decimal(0))
    recorded, bases = Spend(), set()
    for job_attempts in by_job.values():
        billed = {id(a) for a in invoiced_attempts(job_attempts, covered=covered)}
        for attempt in job_attempts:
            if id(attempt) not in billed:
                recorded = recorded + attempt_spend_between(attempt, lo, hi, now=now)
                bases.add(RECORDED)
                continue
            share = stretch_share(attempt, lo, hi, now=now)
            for name, value in invoiced_parts([attempt]):
                invoiced[name] += value * share
            bases.add(INVOICED)
    parts = tuple(
        (name, (invoiced[name] + Decimal(str(getattr(recorded, name)))).quantize(MICRO))
        for name in PARTS
    )
    basis = PARTLY_INVOICED if len(bases) == 2 else bases.pop() if bases else RECORDED
    invoiced_usd = sum(invoiced.values(), Decimal(0)).quantize(MICRO)
    return JobCost(basis, parts, invoiced_usd=invoiced_usd)


def team_cost_between(team, lo: datetime, hi: datetime, *, now: datetime) -> JobCost:
    """What TEAM's jobs cost in [LO, HI) as seen at NOW (the dashboard's month)."""
    attempts = (
        Attempt.objects.filter(job__team=team, rented_at__lt=hi)
        .exclude(rented_at=None)
        .exclude(ended_at__lt=lo)
        .prefetch_related(charges_prefetch())
    )
    return cost_between(list(attempts), lo, hi, now=now, covered=covered_until(team))


def cost_series(job, moments: list[datetime], *, now: datetime, cost: JobCost) -> list[float]:
    """JOB's cost at each of MOMENTS (oldest first), by the module docstring's spread; the
    last moment reads COST, the job's cost now (``billing.cost.job_cost``), so the chart
    ends where every other surface stands."""
    attempts = [a for a in job.attempts.all() if a.rented_at is not None]
    covered = covered_until(job.team_id) if cost.basis != RECORDED else None
    out = []
    for moment in moments[:-1]:
        so_far = cost_between(attempts, job.created_at, moment, now=now, covered=covered)
        out.append(float(so_far.total))
    return [*out, float(cost.total)] if moments else []
