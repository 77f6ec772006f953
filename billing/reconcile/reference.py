"""Savings: the cost of the work against renting the team's reference GPU for the same work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from billing.reconcile.tolerance import percent


@dataclass(frozen=True)
class Savings:
    """Billed (or estimated) cost against renting the team's reference for the same work."""

    cost: float
    reference_usd: float
    reference_hours: float

    @property
    def saved_usd(self) -> float:
        return self.reference_usd - self.cost

    @property
    def saved_pct(self) -> float | None:
        return percent(self.saved_usd, self.reference_usd)


def reference_hours(*, machine_h: float, training_h: float, speed_factor: float) -> float:
    """Hours the reference would need: start-up as long as here (downloads do not get faster
    on a faster GPU), training divided by the reference's speed factor."""
    training_h = min(training_h, machine_h)
    return (machine_h - training_h) + training_h / (speed_factor or 1.0)


def savings(team, *, cost: float, machine_h: float, training_h: float) -> Savings:
    """COST against TEAM's reference rate for MACHINE_H on a machine, TRAINING_H of it training."""
    hours = reference_hours(
        machine_h=machine_h,
        training_h=training_h,
        speed_factor=float(team.reference_speed_factor),
    )
    return Savings(cost, hours * float(team.reference_rate_usd_per_hour), hours)


def machine_and_training_hours(attempts, *, now: datetime) -> tuple[float, float]:
    """Hours on machines (rented to end) and of training (running to end), summed."""
    machine = training = 0.0
    for a in attempts:
        end = a.ended_at or now
        if a.rented_at:
            machine += max((end - a.rented_at).total_seconds(), 0.0) / 3600.0
        if a.running_at:
            training += max((end - a.running_at).total_seconds(), 0.0) / 3600.0
    return machine, training
