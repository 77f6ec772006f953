"""A real run through the whole supervisor, billed by the sandbox: after the import the job's
cost is the invoice, and what NomadGPU recorded agrees with it within the tolerance."""

from __future__ import annotations

import pytest
from django.utils import timezone

from billing import invoices, reconcile
from billing.models import DiscrepancyFlag
from jobs.models import JobState
from tests.e2e.conftest import toy_env, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_finished_toy_job_reconciles_with_its_invoice(supervisor):
    job = supervisor.submit_toy(env=toy_env(120, 40, 0.08), total_steps=120)
    wait_state(job, JobState.SUCCEEDED, timeout=120)
    assert reconcile.job_cost(job).basis == "estimated"  # nothing imported yet

    now = timezone.now()
    invoices.sync_team(supervisor.team, now=now)
    reconcile.flag_discrepancies(supervisor.team, now=now)

    row = reconcile.reconcile_job(job, now=now)
    (attempt,) = row.attempts
    print({c.name: (round(c.recorded, 5), round(c.billed, 5)) for c in attempt.components})
    assert attempt.status == reconcile.Status.MATCHED, attempt.components
    assert attempt.billed > 0
    assert row.cost.basis == "invoiced"
    assert row.cost.amount == pytest.approx(attempt.billed)
    assert row.savings.reference_usd > row.cost.amount
    assert not DiscrepancyFlag.objects.filter(team=supervisor.team).exists()
