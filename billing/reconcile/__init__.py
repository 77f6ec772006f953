"""Reconciliation: what Vast billed against what NomadGPU recorded, and the savings.

"Recorded" is ``billing.spend.attempt_spend``, what NomadGPU recorded; "billed" is the sum of
the imported charges matched to the attempt. They are compared per component (GPU, storage,
download, upload) and in total, each attempt gets a status, and what stays apart is flagged
for finance.

One question per file:

- ``matching``: which attempt a charge belongs to.
- ``tolerance``: when billed is close enough to recorded (``Status``, ``Tolerance``).
- ``components``: recorded against billed for each component of one attempt.
- ``attempt``: one attempt's status and the reason for its largest gap.
- ``reference``: the savings against renting the team's reference GPU.
- ``job``: one job reconciled (its attempts, its one cost, its savings).
- ``period_report``: what finance sees for a span of UTC days.
- ``flags``: the flags and events of attempts and unmatched charges (``flag_discrepancies``).
- ``period_flags``: days and months whose small differences add up.
- ``review``: a flag closed by a person or by numbers that agree again.

This module re-exports the public names, so callers keep writing ``reconcile.reconcile_job``.
"""

from __future__ import annotations

from billing.cost import job_cost as job_cost  # re-exported: the one cost lives in billing.cost
from billing.reconcile.attempt import (
    AttemptReconciliation,
    attempt_status,
    charges_prefetch,
    explain,
    reconcile_attempt,
)
from billing.reconcile.components import COMPONENTS, Component, compare_components
from billing.reconcile.flags import flag_discrepancies
from billing.reconcile.job import JobReconciliation, reconcile_job
from billing.reconcile.matching import match_charges
from billing.reconcile.period_flags import PeriodTotal, flag_periods
from billing.reconcile.period_report import (
    PeriodReport,
    period_bounds,
    reconcile_between,
    reconcile_period,
)
from billing.reconcile.reference import Savings, machine_and_training_hours, savings
from billing.reconcile.review import close_open_flags, mark_reviewed
from billing.reconcile.tolerance import Status, Tolerance, difference_status

__all__ = [
    "COMPONENTS",
    "AttemptReconciliation",
    "Component",
    "JobReconciliation",
    "PeriodReport",
    "PeriodTotal",
    "Savings",
    "Status",
    "Tolerance",
    "attempt_status",
    "charges_prefetch",
    "close_open_flags",
    "compare_components",
    "difference_status",
    "explain",
    "flag_discrepancies",
    "flag_periods",
    "job_cost",
    "machine_and_training_hours",
    "mark_reviewed",
    "match_charges",
    "period_bounds",
    "reconcile_attempt",
    "reconcile_between",
    "reconcile_job",
    "reconcile_period",
    "savings",
]
