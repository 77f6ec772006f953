"""Importing Vast's charges and payments: every page, day by day, idempotent, resumable; and
the CSV upload, all or nothing."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import invoices
from billing.models import Charge, ChargeItem, InvoiceSync, Payment
from hosts.vast import VastError
from tests.support.factories import JobFactory, TeamFactory, make_attempt
from tests.support.vast_billing_fake import FakeVastBilling, charge, epoch

DAY1 = date(2026, 3, 1)
NOW = datetime(2026, 3, 8, 12, tzinfo=UTC)


def days(n: int) -> list[date]:
    return [DAY1 + timedelta(days=i) for i in range(n)]


def team_on(fake: FakeVastBilling):
    team = TeamFactory(slug="ledger", vast_url=fake.url, vast_api_key="billing-key")
    job = JobFactory(team=team)
    rented = datetime(2026, 3, 1, 0, 30, tzinfo=UTC)
    make_attempt(job, state="ended", instance_id=1, rented_at=rented, ended_at=rented)
    return team


def snapshot(team) -> list[tuple]:
    return sorted(
        (c.source, c.day, c.amount, tuple(c.items.values_list("type", "amount")))
        for c in Charge.objects.filter(team=team).prefetch_related("items")
    )


@pytest.mark.django_db
def test_it_imports_every_page_of_hundreds_of_charges(vast_billing: FakeVastBilling):
    vast_billing.charges = [charge(30_000 + n, DAY1, gpu_h=0.5) for n in range(350)]
    team = team_on(vast_billing)

    result = invoices.sync_team(team, now=NOW)

    assert result.charges == 350
    assert Charge.objects.filter(team=team).count() == 350
    assert ChargeItem.objects.filter(charge__team=team, type="gpu").count() == 350
    day1_calls = [c for c in vast_billing.charge_calls() if str(epoch(DAY1)) in c["select_filters"]]
    assert len(day1_calls) == 4  # 100 + 100 + 100 + 50
    assert [bool(c.get("after_token")) for c in day1_calls] == [False, True, True, True]
    item = ChargeItem.objects.filter(charge__source="instance-30007").get()
    assert item.quantity == Decimal("0.5")
    assert item.rate == Decimal("0.4")
    assert item.unit == "hours"
    assert item.rate_unit == "hour"


@pytest.mark.django_db
def test_a_second_import_changes_nothing(vast_billing: FakeVastBilling):
    vast_billing.charges = [charge(40_000 + n, d, gpu_h=1) for d in days(3) for n in range(5)]
    vast_billing.payments = [
        {
            "start": epoch(DAY1, 3),
            "end": epoch(DAY1, 3),
            "type": "credit",
            "source": "stripe",
            "description": "top-up",
            "amount": -25.0,
            "metadata": {"invoice_id": 77, "service": "stripe_payments"},
            "items": [],
        }
    ]
    team = team_on(vast_billing)
    invoices.sync_team(team, now=NOW)
    before = snapshot(team)

    InvoiceSync.objects.filter(team=team).update(charges_complete_through=None)  # all again
    invoices.sync_team(team, now=NOW)

    assert snapshot(team) == before
    assert len(before) == 15
    (payment,) = Payment.objects.filter(team=team)
    assert payment.amount == Decimal("25")
    assert payment.invoice_id == "77"


@pytest.mark.django_db
def test_a_failure_halfway_keeps_the_finished_days_and_resumes_without_duplicates(
    vast_billing: FakeVastBilling,
):
    vast_billing.charges = [charge(50_000 + n, d, gpu_h=2) for d in days(5) for n in range(3)]
    vast_billing.fail_days = {DAY1 + timedelta(days=2)}
    team = team_on(vast_billing)

    with pytest.raises(VastError):
        invoices.sync_team(team, now=NOW)

    sync = InvoiceSync.objects.get(team=team)
    assert sync.charges_complete_through == DAY1 + timedelta(days=1)
    assert "upstream broke" in sync.last_error
    assert {c.day for c in Charge.objects.filter(team=team)} == set(days(2))

    vast_billing.fail_days = set()
    vast_billing.calls.clear()
    invoices.sync_team(team, now=NOW)

    first_asked = vast_billing.charge_calls()[0]["select_filters"]
    assert str(epoch(DAY1 + timedelta(days=2))) in first_asked  # resumed at the failed day
    assert Charge.objects.filter(team=team).count() == 15
    assert sorted({c.day for c in Charge.objects.filter(team=team)}) == days(5)
    sync.refresh_from_db()
    assert sync.last_error == ""
    assert sync.charges_complete_through == NOW.date() - timedelta(1)


@pytest.mark.django_db
def test_today_is_imported_but_never_marked_complete(vast_billing: FakeVastBilling):
    team = team_on(vast_billing)
    now = datetime(2026, 3, 2, 3, tzinfo=UTC)  # 3 h after midnight: yesterday not settled

    invoices.sync_team(team, now=now)

    assert InvoiceSync.objects.get(team=team).charges_complete_through is None
    assert len(vast_billing.charge_calls()) == 2  # 1 and 2 March, and again next time


@pytest.mark.django_db
def test_item_text_in_a_wording_we_do_not_know_keeps_its_amount_unparsed(
    vast_billing: FakeVastBilling,
):
    # Only the GPU wording is documented (show_charges.yaml): the others may read any way.
    row = charge(60_001, DAY1, gpu_h=2, down_gb=15, down_rate=0.0439)
    row["items"][1]["description"] = "Internet: download bandwidth (15 GiB)"
    disk = {**row["items"][0], "type": "disk", "description": "Storage", "amount": 0.012}
    row["items"].append(disk)
    row["amount"] = round(sum(i["amount"] for i in row["items"]), 3)
    vast_billing.charges = [row]
    team = team_on(vast_billing)

    invoices.sync_team(team, now=NOW)

    items = {i.type: i for i in ChargeItem.objects.filter(charge__source="instance-60001")}
    assert (items["gpu"].quantity, items["gpu"].rate) == (Decimal("2"), Decimal("0.4"))
    for kind, amount in (("bwd", Decimal("0.658")), ("disk", Decimal("0.012"))):
        assert items[kind].amount == amount
        assert (items[kind].quantity, items[kind].rate) == (None, None)
    assert Charge.objects.get(source="instance-60001").amount == Decimal(str(row["amount"]))


# --- CSV --------------------------------------------------------------------------------------

HEADER = "day,source,type,label,start,end,description,item_type,item_description,item_amount\n"
GOOD = (
    "2026-03-01,instance-7,instance,ngpu:dev:1:1,1772326800,1772330400,Instance 7 Charges,"
    "gpu,0.440 hours at $0.400/hour,0.176\n"
    "2026-03-01,instance-7,instance,ngpu:dev:1:1,1772326800,1772330400,Instance 7 Charges,"
    "bwd,15.000 GB downloaded at $0.043945/GB,0.659\n"
)


@pytest.mark.django_db
def test_a_shared_account_export_keeps_only_the_teams_own_instances():
    team = TeamFactory()  # on the server's shared key: instance 7 is not one of its rentals

    result = invoices.import_csv(team, (HEADER + GOOD).encode(), now=NOW)

    assert (result.charges, result.skipped) == (0, 1)
    assert not Charge.objects.filter(team=team).exists()


@pytest.mark.django_db
def test_a_csv_export_is_imported_as_one_charge_with_its_items():
    team = TeamFactory(vast_api_key="own-account")  # the account is the team's: every row

    result = invoices.import_csv(team, (HEADER + GOOD).encode(), now=NOW)

    assert result.charges == 1
    assert result.items == 2
    (imported,) = Charge.objects.filter(team=team)
    assert imported.amount == Decimal("0.835")
    assert imported.instance_id == 7
    bwd = imported.items.get(type="bwd")
    assert bwd.quantity == Decimal("15.000")
    assert bwd.unit == "GB"

    invoices.import_csv(team, (HEADER + GOOD).encode(), now=NOW)  # the same file again
    assert Charge.objects.filter(team=team).count() == 1
    assert ChargeItem.objects.filter(charge__team=team).count() == 2


@pytest.mark.django_db
def test_a_malformed_csv_is_rejected_with_line_numbers_and_nothing_is_imported():
    team = TeamFactory()
    bad = (
        HEADER
        + GOOD
        + "2026-03-02,instance-8,instance,,,,x,gpu,1 hours at $1/hour,lots\n"  # line 4
        + "03/02/2026,instance-9,instance,,,,x,gpu,1 hours at $1/hour,1\n"  # line 5
        + "2026-03-02,instance-10,instance,,,,x,gpux,1 hours at $1/hour,1\n"  # line 6
        + "2026-03-02,,instance,,,,x,gpu,1 hours at $1/hour,1\n"  # line 7
    )

    with pytest.raises(invoices.CsvRejected) as rejected:
        invoices.import_csv(team, bad.encode(), now=NOW)

    assert [line for line, _ in rejected.value.errors] == [4, 5, 6, 7]
    assert "item_amount" in rejected.value.errors[0][1]
    assert "YYYY-MM-DD" in rejected.value.errors[1][1]
    assert not Charge.objects.filter(team=team).exists()


@pytest.mark.django_db
def test_a_csv_without_the_columns_is_rejected_on_line_1():
    with pytest.raises(invoices.CsvRejected) as rejected:
        invoices.import_csv(TeamFactory(), b"when,what\n1,2\n", now=NOW)

    assert rejected.value.errors[0][0] == 1
    assert "missing columns" in rejected.value.errors[0][1]


@pytest.mark.django_db
def test_the_periodic_task_imports_matches_and_flags(vast_billing: FakeVastBilling, settings):
    from billing.models import DiscrepancyFlag
    from billing.tasks import sync_team_invoices

    today = datetime.now(UTC).date()
    vast_billing.charges = [charge(1, today, gpu_h=1), charge(2, today, gpu_h=1)]
    team = team_on(vast_billing)
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    team.jobs.get().attempts.update(rented_at=midnight, ended_at=midnight + timedelta(hours=3))

    result = sync_team_invoices(team.pk)

    assert result["charges"] == 2
    assert result["matched"] == 1  # instance 1 is our attempt; instance 2 is not ours
    assert DiscrepancyFlag.objects.filter(team=team, charge__source="instance-2").exists()
    schedule = settings.CELERY_BEAT_SCHEDULE["billing-sync-invoices"]
    assert schedule["task"] == "billing.tasks.sync_invoices"


@pytest.mark.django_db
def test_teams_on_the_shared_server_key_import_only_their_own_instances(
    vast_billing: FakeVastBilling, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = vast_billing.url, "server-key"
    vast_billing.charges = [charge(n, DAY1, gpu_h=1) for n in (1, 2, 3)]
    rented = datetime(2026, 3, 1, 0, 30, tzinfo=UTC)
    teams = []
    for n, slug in ((1, "one"), (2, "two")):
        team = TeamFactory(slug=slug)  # no key of its own: the server's account
        make_attempt(JobFactory(team=team), state="ended", instance_id=n, rented_at=rented)
        invoices.sync_team(team, now=NOW)
        teams.append(team)

    assert [c.source for c in Charge.objects.filter(team=teams[0])] == ["instance-1"]
    assert [c.source for c in Charge.objects.filter(team=teams[1])] == ["instance-2"]
    assert not Charge.objects.filter(source="instance-3").exists()  # nobody's


@pytest.mark.django_db
def test_a_charge_that_cannot_be_stored_leaves_the_others_stored_and_its_day_open(
    vast_billing: FakeVastBilling,
):
    # One row in a day's answer that no column can hold (an amount of 10^12 dollars) must not
    # stop the import of the rest, nor of later days; its day is asked for again next time.
    odd = charge(70_001, DAY1, gpu_h=2)
    odd["amount"] = 1e12
    vast_billing.charges = [
        odd,
        charge(70_002, DAY1, gpu_h=2),
        charge(70_003, DAY1 + timedelta(1), gpu_h=1),
    ]
    team = team_on(vast_billing)

    invoices.sync_team(team, now=NOW)

    stored = set(Charge.objects.filter(team=team).values_list("source", flat=True))
    assert stored == {"instance-70002", "instance-70003"}
    sync = InvoiceSync.objects.get(team=team)
    assert "charge instance-70001 of 2026-03-01 could not be stored" in sync.last_error
    assert sync.charges_complete_through is None  # the first day stays to be imported again
