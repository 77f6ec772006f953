"""The status page counts money too, through HTTP: per window, what interruptions cost (steps
redone at the replacement's $/h plus the start-up paid again) and the savings against the
reference cloud from billing's savings report, invoiced where the invoice covers a job; as
totals, with no job details."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.cache import cache

from billing import reconcile
from jobs.models import Interruption, JobState
from nomadgpu.humanize import money
from tests.support.charges import bill
from tests.support.factories import (
    InterruptionFactory,
    InvoiceSyncFactory,
    JobFactory,
    TeamFactory,
    make_attempt,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DETECTED = NOW - timedelta(days=1)
# The replacement: $0.40/h GPU, 20 GB at $0.0002/GB/h, downloads at $0.01/GB; its start-up was
# priced for 10 GB (image, model, checkpoint). Rented 20 s after the loss, its agent up 60 s
# later, its first step 120 s after that; it trains at 0.5 s/step.
REDONE_USD = 80 * 0.5 * 0.40 / 3600  # steps 100..180 again
STARTUP_USD = 120 * 0.40 / 3600 + 180 * 20 * 0.0002 / 3600 + 10 * 0.01


@pytest.fixture(autouse=True)
def frozen():
    cache.clear()
    with time_machine.travel(NOW, tick=False):
        yield
    cache.clear()


def public_team(slug: str = "open-lab"):
    return TeamFactory(name="Open Lab", slug=slug, time_zone="UTC", public_status_page=True)


def interrupted_job(team) -> Interruption:
    """A job whose host was lost at step 180 and resumed from 100 on a replacement."""
    job = JobFactory(team=team, state=JobState.RUNNING, total_steps=300)
    lost, _ = make_attempt(job, number=1, state="ended", dph_base=0.40)
    rented = DETECTED + timedelta(seconds=20)
    replacement, _ = make_attempt(
        job,
        number=2,
        state="running",
        dph_base=0.40,
        disk_gb=20,
        storage_usd_per_gb_hour=0.0002,
        download_usd_per_gb=0.01,
        seconds_per_step=0.5,
        rented_at=rented,
        registered_at=rented + timedelta(seconds=60),
        running_at=rented + timedelta(seconds=170),
        first_step_at=rented + timedelta(seconds=180),
        decision={"chosen": {"cost": {"download_gb": 10.0}}},
    )
    return InterruptionFactory(
        attempt=lost,
        cause="provider_gone",
        last_heartbeat_at=DETECTED - timedelta(seconds=30),
        detected_at=DETECTED,
        replacement_rented_at=rented,
        running_again_at=rented + timedelta(seconds=180),
        step_reached=180,
        resumed_step=100,
        replacement=replacement,
    )


def finished_run(team, *, instance_id: int, billed: str | None, ago: timedelta):
    """The field report's run (0.44 h, 19 min training, $0.40/h: $0.176 recorded), ended AGO,
    billed BILLED dollars of GPU when given."""
    start = NOW - ago
    job = JobFactory(team=team, state=JobState.SUCCEEDED)
    attempt, _ = make_attempt(
        job,
        state="ended",
        instance_id=instance_id,
        rented_at=start,
        registered_at=start,
        running_at=start + timedelta(hours=0.44) - timedelta(minutes=19),
        ended_at=start + timedelta(hours=0.44),
        dph_base=0.40,
    )
    if billed is not None:
        bill(attempt, ("gpu", "0.475 hours at $0.400/hour", billed), day=start.date())
    return job


def reference_usd(team) -> float:
    """The field report's run on the reference: 0.44 h at the team's rate, same speed."""
    return 0.44 * float(team.reference_rate_usd_per_hour)


def test_the_json_prices_the_windows_interruptions(client):
    team = public_team()
    interrupted_job(team)

    body = client.get("/status/open-lab.json").json()

    cost = body["interruption_cost_usd"]
    assert body["version"] == 3  # added within version 2, kept since
    assert cost["interruptions_priced"] == 1
    assert cost["steps_redone"] == 80
    assert cost["redone_work"] == pytest.approx(REDONE_USD, abs=1e-6)  # six decimals
    assert cost["startup_again"] == pytest.approx(STARTUP_USD, abs=1e-6)
    assert cost["total"] == pytest.approx(REDONE_USD + STARTUP_USD, abs=1e-6)


def test_an_interruption_not_yet_running_again_is_not_priced(client):
    team = public_team()
    row = interrupted_job(team)
    Interruption.objects.filter(pk=row.pk).update(running_again_at=None, replacement=None)

    cost = client.get("/status/open-lab.json").json()["interruption_cost_usd"]

    assert (cost["interruptions_priced"], cost["total"]) == (0, 0.0)


def test_the_savings_use_the_invoice_where_it_covers_the_job(client):
    team = public_team()
    finished_run(team, instance_id=301, billed="0.190", ago=timedelta(days=2))  # invoiced
    finished_run(team, instance_id=302, billed=None, ago=timedelta(hours=1))  # after the import
    InvoiceSyncFactory(team=team, synced_until=NOW - timedelta(days=1))

    savings = client.get("/status/open-lab.json").json()["savings"]

    recorded = 0.44 * 0.40  # the second run, not invoiced yet
    assert (savings["jobs"], savings["jobs_invoiced"]) == (2, 1)
    assert savings["invoiced_usd"] == pytest.approx(0.19, abs=1e-6)
    assert savings["cost_usd"] == pytest.approx(0.19 + recorded, abs=1e-6)
    assert savings["reference_usd"] == pytest.approx(2 * reference_usd(team), abs=1e-6)
    saved = 2 * reference_usd(team) - 0.19 - recorded
    assert savings["saved_usd"] == pytest.approx(saved, abs=1e-6)
    assert savings["reference"] == {
        "name": team.reference_name,
        "usd_per_hour": float(team.reference_rate_usd_per_hour),
        "speed_factor": float(team.reference_speed_factor),
    }
    # The same figures as billing's savings report on the finance page for those days.
    report = reconcile.reconcile_period(team, (NOW - timedelta(days=2)).date(), NOW.date(), now=NOW)
    assert savings["saved_usd"] == pytest.approx(report.savings.saved_usd, abs=1e-6)


def test_savings_count_only_the_window(client):
    team = public_team()
    finished_run(team, instance_id=301, billed=None, ago=timedelta(days=10))
    finished_run(team, instance_id=302, billed=None, ago=timedelta(days=2))

    week = client.get("/status/open-lab.json", {"days": "7"}).json()["savings"]
    month = client.get("/status/open-lab.json", {"days": "30"}).json()["savings"]

    assert (week["jobs"], month["jobs"]) == (1, 2)


def test_the_page_shows_the_interruption_cost_and_the_savings(client):
    team = public_team()
    interrupted_job(team)
    finished_run(team, instance_id=301, billed="0.190", ago=timedelta(days=2))
    InvoiceSyncFactory(team=team, synced_until=NOW - timedelta(days=1))
    status = client.get("/status/open-lab.json").json()

    html = client.get("/status/open-lab/").content.decode()

    total = status["interruption_cost_usd"]["total"]
    assert f'id="n-interruption-cost">{money(total)}<' in html
    assert "80 steps redone" in html
    assert "1 of 1 interruption priced" in html
    assert f'id="n-saved">{money(status["savings"]["saved_usd"])}<' in html
    assert f'id="n-invoiced">{money(0.19)}<' in html
    assert f"Saved against {team.reference_name}" in html


def test_no_job_detail_comes_with_the_money(client):
    team = public_team()
    row = interrupted_job(team)
    job = row.job
    job.name, job.command = "zz-secret-run", "zz-secret-cmd"
    job.save()

    body = client.get("/status/open-lab.json").json()
    html = client.get("/status/open-lab/").content.decode()

    for text in (str(body), html):
        assert "zz-secret" not in text
        assert not re.search(r"0\.4000?\b", text)  # no host's price
    assert set(body["interruption_cost_usd"]) == {
        "interruptions_priced", "steps_redone", "redone_work", "startup_again", "total",
    }  # fmt: skip
