"""A hedged rent's losers are money the job spent (``billing.spend.racer_spend``): their storage
from creation, their GPU once Vast ran them, their image pull where the host bills download;
counted in the job's one cost, matched to their attempt on the invoice, imported on a shared
account, and reconciled with the attempt they raced for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from billing import reconcile
from billing.cost import job_cost
from billing.invoices import charge_filter
from billing.models import Charge
from billing.spend import GB, attempt_spend, racer_spend
from jobs.models import Racer, RacerState
from nomadgpu.humanize import money
from tests.support.factories import (
    ChargeFactory,
    ChargeItemFactory,
    JobFactory,
    UserFactory,
    make_attempt,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
STORAGE = 0.0002  # $/GB-hour (0.146 $/GB-month)
DISK = 50.0


def race_won(
    *, loser_status: str = "loading", loser_running: bool = False, first: int = 21_000_001
):
    """An attempt that raced two hosts: the winner's instance is its own (created at T0,
    registered 71 s later, still running), the loser (a host billing $0.01/GB of download,
    a 3 GB pull) was destroyed at the win."""
    job = JobFactory(state="running")
    won_at = T0 + timedelta(seconds=71)
    attempt, _ = make_attempt(
        job,
        state="running",
        instance_id=first,
        raced=2,
        rented_at=T0,
        registered_at=won_at,
        dph_base=0.35,
        storage_usd_per_gb_hour=STORAGE,
        disk_gb=DISK,
    )
    common = {"attempt": attempt, "storage_usd_per_gb_hour": STORAGE, "disk_gb": DISK}
    Racer.objects.create(
        **common, position=1, label="l1", offer_id=1, state=RacerState.WON,
        instance_id=first, rented_at=T0, registered_at=won_at, dph_base=0.35,
    )  # fmt: skip
    loser = Racer.objects.create(
        **common, position=2, label="l2", offer_id=2, state=RacerState.LOST,
        instance_id=first + 1, rented_at=T0 + timedelta(seconds=2), ended_at=won_at,
        dph_base=0.40, download_usd_per_gb=0.01, pull_gb=3.0, provider_status=loser_status,
        loading_at=T0 + timedelta(seconds=30) if loser_status != "created" else None,
        running_at=T0 + timedelta(seconds=60) if loser_running else None,
    )  # fmt: skip
    return attempt, loser


def test_a_loser_costs_its_storage_from_its_create_and_its_pull_once_it_began():
    _, loser = race_won()

    spent = racer_spend(loser, now=T0 + timedelta(hours=5))  # it ended at the win

    assert spent.storage == pytest.approx(STORAGE * DISK * 69 / 3600)
    assert spent.download == pytest.approx(0.03)
    assert spent.gpu == 0.0  # Vast bills no GPU while loading


def test_a_loser_never_picked_up_pulled_nothing_and_one_that_ran_billed_its_gpu():
    _, waiting = race_won(loser_status="created")
    assert racer_spend(waiting, now=T0 + timedelta(hours=1)).download == 0.0

    _, ran = race_won(loser_running=True, first=21_000_011)
    assert racer_spend(ran, now=T0 + timedelta(hours=1)).gpu == pytest.approx(0.40 * 11 / 3600)


def test_the_jobs_cost_counts_the_loser_and_the_winner_once():
    attempt, loser = race_won()
    now = T0 + timedelta(minutes=10)

    alone = (
        0.35 * (10 * 60 - 71) / 3600  # the winner's GPU from its register
        + STORAGE * DISK * 600 / 3600  # its storage from its create
    )
    spent = attempt_spend(attempt, now=now)

    assert spent.total == pytest.approx(alone + racer_spend(loser, now=now).total)
    assert float(job_cost(attempt.job, now=now).total) == pytest.approx(spent.total, abs=2e-6)


def test_a_losers_charge_is_matched_to_the_attempt_it_raced_for_and_invoiced_with_it():
    attempt, loser = race_won()
    attempt.ended_at = T0 + timedelta(hours=1)
    attempt.save(update_fields=["ended_at"])
    team = attempt.job.team
    for instance_id, amount in ((attempt.instance_id, "0.3600"), (loser.instance_id, "0.0310")):
        charge = ChargeFactory(
            team=team, instance_id=instance_id, source=f"instance-{instance_id}", day=T0.date(),
            amount=Decimal(amount),
        )  # fmt: skip
        ChargeItemFactory(charge=charge, type="disk", amount=Decimal(amount))

    assert reconcile.match_charges(team, now=T0 + timedelta(days=2)) == 2

    assert set(Charge.objects.values_list("attempt_id", flat=True)) == {attempt.pk}
    covered = T0 + timedelta(days=2)
    cost = job_cost(attempt.job, now=covered, covered=covered)
    assert cost.invoiced
    assert cost.total == Decimal("0.391")


def test_a_shared_accounts_import_keeps_the_charges_of_a_teams_losers():
    attempt, loser = race_won()
    mine = charge_filter(attempt.job.team)

    assert mine(Charge(instance_id=loser.instance_id))
    assert mine(Charge(instance_id=attempt.instance_id))
    assert not mine(Charge(instance_id=99))


def test_reconciliation_counts_the_losers_hours_and_bytes_with_the_attempts():
    attempt, _ = race_won()
    end = T0 + timedelta(hours=1)
    attempt.ended_at = end
    attempt.save(update_fields=["ended_at"])

    rows = reconcile.compare_components(attempt, (), now=end, tolerance=reconcile.Tolerance())

    by_name = {c.name: c for c in rows}
    winner_gb_h = DISK * 1.0
    loser_gb_h = DISK * 69 / 3600
    assert by_name["storage"].recorded_qty == pytest.approx(winner_gb_h + loser_gb_h)
    assert by_name["download"].recorded_qty == pytest.approx(3.0)
    assert by_name["download"].recorded == pytest.approx(0.03)
    assert GB == 1024**3


def test_the_admin_shows_an_attempts_racers_and_what_each_cost(client):
    attempt, loser = race_won()
    client.force_login(UserFactory(is_superuser=True, is_staff=True))

    page = client.get(reverse("admin:jobs_attempt_change", args=[attempt.pk])).content.decode()
    listed = client.get(reverse("admin:jobs_racer_changelist")).content.decode()

    cost = money(racer_spend(loser, now=loser.ended_at).total)
    assert "the attempt&#x27;s" in page  # the winner's cost is the attempt's own
    assert cost in page
    assert str(loser.instance_id) in listed
    assert cost in listed
