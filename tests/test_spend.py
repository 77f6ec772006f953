"""Recorded spend per attempt and job, from the offer's rates (billing/spend.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from billing.spend import GB, Spend, attempt_spend, job_spend
from tests.factories import JobFactory, make_attempt

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
