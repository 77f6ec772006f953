"""The money on a team's status page, per window, with no job details: what interruptions
cost, and what the team saved against its reference cloud.

- **Interruption cost**, per resumed interruption with a known replacement: the steps done
  again at the replacement's s/step and GPU $/h (``jobs.anatomy``'s lost work) plus the
  start-up paid again on the replacement, from its rent to its first training step: GPU
  from the provider's ``running`` (Vast does not bill the image pull as GPU), storage from the
  rent (``billing.spend``), and the downloads its start-up was priced for (image, model,
  checkpoint; the byte counters carry no times). An interruption whose figures are not known
  (an older agent, a replacement rented before the decision was kept) is not priced, and
  ``priced`` says how many were.
- **Savings**: billing's savings report (``billing.reconcile.reconcile_between``, the one
  the finance page sums) over the jobs with an attempt rented in the window: each job's cost
  is invoiced where the invoice covers it, else recorded, against the team's reference rate
  for the same work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from billing.reconcile import JobReconciliation, reconcile_between
from billing.spend import attempt_spend_between
from jobs import anatomy
from jobs.models import Attempt, Interruption
from jobs.rent_decision import RentDecision
from nomadgpu.models import Team


@dataclass(frozen=True)
class InterruptionCost:
    """The window's interruptions in dollars (module docstring)."""

    priced: int  # interruptions with both figures known
    steps_redone: int
    redone_usd: float
    startup_usd: float

    @property
    def total_usd(self) -> float:
        """Work done again plus start-ups paid again."""
        return self.redone_usd + self.startup_usd


def startup_usd(replacement: Attempt) -> float | None:
    """What REPLACEMENT cost before its first training step (module docstring); None while
    it has not trained or was never rented."""
    until = replacement.first_step_at or replacement.running_at
    if replacement.rented_at is None or until is None:
        return None
    spent = attempt_spend_between(replacement, replacement.rented_at, until, now=until)
    downloads_gb = RentDecision.of(replacement).startup_download_gb
    return spent.gpu + spent.storage + replacement.download_usd_per_gb * downloads_gb


def interruption_price(row: Interruption) -> tuple[int, float, float] | None:
    """(steps redone, their $, the start-up's $) of one interruption; None when not known."""
    replacement = anatomy.replacement_of(row)
    if replacement is None or row.running_again_at is None:
        return None
    work = anatomy.lost_work(row, replacement)
    again = startup_usd(replacement)
    if work.usd is None or again is None:
        return None
    return work.steps or 0, work.usd, again


def interruption_costs(rows: list[Interruption]) -> InterruptionCost:
    """What ROWS (interruptions, loaded with their replacement) cost, summed."""
    prices = [p for p in map(interruption_price, rows) if p is not None]
    return InterruptionCost(
        priced=len(prices),
        steps_redone=sum(steps for steps, _, _ in prices),
        redone_usd=sum(usd for _, usd, _ in prices),
        startup_usd=sum(usd for _, _, usd in prices),
    )


@dataclass(frozen=True)
class WindowSavings:
    """The window's jobs against the team's reference cloud (module docstring)."""

    jobs: int
    jobs_invoiced: int
    cost_usd: float
    invoiced_usd: float  # the part of cost_usd that is the invoice
    reference_usd: float
    reference_name: str
    reference_usd_per_hour: float
    reference_speed_factor: float

    @property
    def saved_usd(self) -> float:
        """The reference's cost of the same work minus what the jobs cost."""
        return self.reference_usd - self.cost_usd

    @property
    def saved_pct(self) -> float | None:
        """How much cheaper than the reference, in percent (None without a reference cost)."""
        return 100.0 * self.saved_usd / self.reference_usd if self.reference_usd else None


def window_savings(team: Team, *, since: datetime, now: datetime) -> WindowSavings:
    """Billing's savings report over TEAM's jobs with an attempt rented from SINCE to NOW."""
    jobs = reconcile_between(team, since, now, now=now)
    return savings_of(team, jobs)


def savings_of(team: Team, jobs: list[JobReconciliation]) -> WindowSavings:
    """JOBS' costs (invoiced where the invoice covers each) against TEAM's reference."""
    invoiced = [j for j in jobs if j.cost.basis == "invoiced"]
    return WindowSavings(
        jobs=len(jobs),
        jobs_invoiced=len(invoiced),
        cost_usd=sum(j.savings.cost for j in jobs),
        invoiced_usd=sum(j.cost.amount for j in invoiced),
        reference_usd=sum(j.savings.reference_usd for j in jobs),
        reference_name=team.reference_name,
        reference_usd_per_hour=float(team.reference_rate_usd_per_hour),
        reference_speed_factor=float(team.reference_speed_factor),
    )
