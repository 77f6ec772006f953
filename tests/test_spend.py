"""Recorded spend per attempt and job, from the offer's rates (billing/spend.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.spend import (
    GB,
    Spend,
    attempt_spend,
    burn_rate_per_hour,
    gpu_started_at,
    job_spend,
    traffic_bytes,
)
from tests.support.factories import JobFactory, TeamFactory, make_attempt

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
RATES = {
    "dph_base": 0.40,
    "storage_usd_per_gb_hour": 0.15 / 720,  # $0.15/GB/month
    "download_usd_per_gb": 0.02,
    "upload_usd_per_gb": 0.01,
    "disk_gb": 50.0,
}


def test_storage_from_rent_gpu_from_registration_traffic_from_counters():
    attempt, _ = make_attempt(
        state="running",
        rented_at=T0,
        registered_at=T0 + timedelta(minutes=6),  # the image pull: storage only
        bytes_down=15 * GB,
        bytes_up=2 * GB,
        **RATES,
    )

    spend = attempt_spend(attempt, now=T0 + timedelta(minutes=66))

    assert spend.gpu == pytest.approx(0.40 * 1.0)
    assert spend.storage == pytest.approx(0.15 / 720 * 50 * 1.1)
    assert spend.download == pytest.approx(0.30)
    assert spend.upload == pytest.approx(0.02)
    assert spend.total == pytest.approx(0.40 + 0.15 / 720 * 50 * 1.1 + 0.32)


def test_an_ended_attempt_stops_costing_at_its_end():
    attempt, _ = make_attempt(
        state="ended",
        rented_at=T0,
        registered_at=T0,
        ended_at=T0 + timedelta(hours=1),
        **RATES,
    )

    later = attempt_spend(attempt, now=T0 + timedelta(days=3))

    assert later == attempt_spend(attempt, now=T0 + timedelta(hours=1))
    assert later.gpu == pytest.approx(0.40)


def test_the_hours_its_host_was_offline_while_the_job_waited_cost_nothing():
    # Vast bills neither GPU nor storage for an offline host's period: 10 min came back
    # from earlier, and the spell open for the last 5 min.
    attempt, _ = make_attempt(
        state="running",
        rented_at=T0,
        registered_at=T0,
        offline_s=600.0,
        offline_since=T0 + timedelta(minutes=55),
        **RATES,
    )

    spend = attempt_spend(attempt, now=T0 + timedelta(hours=1))

    assert spend.gpu == pytest.approx(0.40 * 45 / 60)
    assert spend.storage == pytest.approx(0.15 / 720 * 50 * 45 / 60)


def test_never_rented_costs_nothing():
    attempt, _ = make_attempt(state="planned", **RATES)

    assert attempt_spend(attempt, now=T0) == Spend()


def test_a_recovered_job_counts_each_attempt_once():
    job = JobFactory()
    make_attempt(
        job,
        number=1,
        state="ended",
        rented_at=T0,
        registered_at=T0,
        ended_at=T0 + timedelta(minutes=30),
        **RATES,
    )
    make_attempt(
        job,
        number=2,
        state="running",
        rented_at=T0 + timedelta(minutes=31),
        registered_at=T0 + timedelta(minutes=31),
        **RATES,
    )

    spend = job_spend(job, now=T0 + timedelta(minutes=61))

    assert spend.gpu == pytest.approx(0.40 * 1.0)
    assert spend.as_dict()["total"] == pytest.approx(spend.total)


# --- GPU from the provider's `running`, the agent's register only where nothing saw it -------


def test_the_gpu_is_recorded_from_the_polls_first_running_read_not_the_agents_register():
    attempt, _ = make_attempt(
        state="running",
        rented_at=T0,
        provider_running_at=T0 + timedelta(minutes=5),  # Vast starts billing the GPU here
        registered_at=T0 + timedelta(minutes=6),  # after the bootstrap: a minute late
        **RATES,
    )

    spend = attempt_spend(attempt, now=T0 + timedelta(minutes=65))

    assert gpu_started_at(attempt) == T0 + timedelta(minutes=5)
    assert spend.gpu == pytest.approx(0.40 * 1.0)


def test_the_containers_own_start_report_beats_a_late_poll():
    # The poll reads every 10 s: it saw `running` 8 s after the container had started.
    attempt, _ = make_attempt(
        rented_at=T0,
        container_started_at=T0 + timedelta(seconds=60),
        provider_running_at=T0 + timedelta(seconds=68),
        registered_at=T0 + timedelta(seconds=75),
        **RATES,
    )

    assert gpu_started_at(attempt) == T0 + timedelta(seconds=60)


def test_the_agents_register_stands_in_only_where_the_poll_never_saw_it_running():
    attempt, _ = make_attempt(rented_at=T0, registered_at=T0 + timedelta(minutes=2), **RATES)
    assert gpu_started_at(attempt) == T0 + timedelta(minutes=2)

    unseen, _ = make_attempt(rented_at=T0, **RATES)
    assert gpu_started_at(unseen) is None
    assert attempt_spend(unseen, now=T0 + timedelta(hours=1)).gpu == 0.0
    assert burn_rate_per_hour(unseen, now=T0 + timedelta(hours=1)) == pytest.approx(
        0.15 / 720 * 50  # storage only, until something sees it run
    )


# --- Traffic: every byte the container moved and the pull where it happened -----------------

PULL = {"profile": {"image_gb": 3.0}}  # what the selection priced the pull at, kept at rent


def test_traffic_is_the_containers_bytes_or_the_agents_whichever_is_larger():
    attempt, _ = make_attempt(
        state="running",
        rented_at=T0,
        registered_at=T0,
        net_rx_bytes=12 * GB,  # a model the training command downloaded
        bytes_down=1 * GB,  # the checkpoint the agent restored (inside the 12 GB)
        net_tx_bytes=GB // 2,
        bytes_up=2 * GB,  # an agent restarted after the counters started over
        **RATES,
    )

    spend = attempt_spend(attempt, now=T0 + timedelta(hours=1))

    assert spend.download == pytest.approx(12 * 0.02)
    assert spend.upload == pytest.approx(2 * 0.01)


def test_the_image_pull_counts_from_the_rent_before_any_counter_reports():
    attempt, _ = make_attempt(rented_at=T0, decision=PULL, **RATES)

    spend = attempt_spend(attempt, now=T0 + timedelta(seconds=1))

    assert spend.download == pytest.approx(3.0 * 0.02)
    assert traffic_bytes(attempt, now=T0 + timedelta(seconds=1)) == (3 * GB, 0)


def test_an_imported_invoice_never_changes_what_was_recorded():
    from billing import invoices, reconcile
    from billing.cost import INVOICED, job_cost

    team = TeamFactory(vast_api_key="own-account")
    job = JobFactory(team=team)
    attempt, _ = make_attempt(
        job,
        state="ended",
        instance_id=7,
        rented_at=datetime(2026, 3, 1, 0, 55, tzinfo=UTC),
        registered_at=datetime(2026, 3, 1, 1, 0, tzinfo=UTC),
        ended_at=datetime(2026, 3, 1, 2, 0, tzinfo=UTC),
        decision={"profile": {"image_gb": 20.0}},  # the profile overstated the image
        download_usd_per_gb=0.0439453125,
    )
    header = "day,source,type,label,start,end,description,item_type,item_description,item_amount"
    row = "2026-03-01,instance-7,instance,ngpu:dev:1:1,1772326800,1772330400,Instance 7 Charges"
    csv = (
        f"{header}\n{row},gpu,1.000 hours at $0.400/hour,0.400\n"
        f"{row},bwd,15.000 GB downloaded at $0.043945/GB,0.659\n"
    )
    now = datetime(2026, 3, 8, tzinfo=UTC)
    before = job_spend(job, now=now)

    invoices.import_csv(team, csv.encode(), now=now)

    assert job_spend(job, now=now) == before  # the limits count what was recorded
    assert before.download == pytest.approx(20 * 0.0439453125)
    download = reconcile.reconcile_attempt(attempt, now=now).components[2]
    assert download.recorded == pytest.approx(20 * 0.0439453125)
    assert download.billed == pytest.approx(0.659)
    cost = job_cost(job, now=now)  # the job's cost is the invoice's, with its own label
    assert (cost.basis, dict(cost.parts)["download"]) == (INVOICED, Decimal("0.659"))
