"""A real run through the whole supervisor, billed by the sandbox: after the import the job's
cost is the invoice, and what NomadGPU recorded agrees with it within the tolerance."""

from __future__ import annotations

import shlex
import sys
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import invoices, reconcile
from billing.models import DiscrepancyFlag
from billing.spend import GB, job_spend
from jobs.models import JobState
from sandbox.timing import image_bytes
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.toy import TOY, toy_env
from tests.support.waiting import wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_finished_toy_job_reconciles_with_its_invoice(supervisor):
    job = supervisor.submit_toy(env=toy_env(120, 40, 0.08), total_steps=120)
    wait_state(job, JobState.SUCCEEDED, timeout=120)
    assert reconcile.job_cost(job).basis == "recorded"  # nothing imported yet

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


def downloading(nbytes: int) -> str:
    """A training command that first fetches NBYTES (a model) through the container's network,
    then trains: what the agent never moves itself, and Vast bills all the same."""
    fetch = (
        "import os, shutil, urllib.request as u; "
        "url = os.environ['SANDBOX_URL'] + '/sandbox/download/' + os.environ['SANDBOX_INSTANCE_ID']"
        f" + '?bytes={nbytes}'; "
        "shutil.copyfileobj(u.urlopen(url), open(os.devnull, 'wb'), 1 << 20)"
    )
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(fetch)} && {TOY}"


def test_a_download_on_a_traffic_charging_host_stops_the_job_and_matches_the_invoice(
    supervisor, enforcer
):
    image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"  # 3.6 GB pulled by the host
    model = int(1.6 * GB)
    job = supervisor.submit_toy(
        image=image,
        command=downloading(model),
        env=toy_env(1500, 100_000, 0.08),
        total_steps=1500,
        # Only the RTX 4090 that charges $45/TB each way is under $0.30/h.
        requirements={**FIELD_REPORT_REQUIREMENTS, "max_dph": 0.30},
        profile={
            "image_gb": image_bytes(image) / GB,
            "model_gb": 1.6,
            "upload_gb": 0.0,
            "reference_seconds_per_step": 0.01,
        },
        # The pull ($0.147) and the model ($0.070) leave about 95 s of the GPU ($0.29/h) of a
        # run that takes 120 s: the job must stop, long after its download finished. (With 30 s
        # left, CI once paused it with no checkpoint: on a loaded machine the start and the
        # download, both wall time on the GPU's bill, can use that up before the first step.)
        budget_usd=Decimal("0.225"),
    )

    wait_state(job, JobState.PAUSED_BUDGET, timeout=240)

    (attempt,) = job.attempts.all()
    assert attempt.download_usd_per_gb == pytest.approx(0.0439453125)
    assert attempt.net_rx_bytes >= model
    spend = job_spend(job, now=timezone.now())
    assert spend.download == pytest.approx((image_bytes(image) + model) / GB * 0.0439, rel=0.01)
    assert job.events.get(kind="budget_paused").data["checkpoint_step"] is not None
    now = timezone.now()
    invoices.sync_team(supervisor.team, now=now)
    reconcile.flag_discrepancies(supervisor.team, now=now)
    (row,) = reconcile.reconcile_job(job, now=now).attempts
    print({c.name: (round(c.recorded, 5), round(c.billed, 5)) for c in row.components})
    assert row.status == reconcile.Status.MATCHED, (row.reason, row.components)
    assert row.components[2].billed == pytest.approx(spend.download, rel=0.01)
    assert not DiscrepancyFlag.objects.filter(team=supervisor.team).exists()
