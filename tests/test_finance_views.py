"""Finance views through the test client: who may see them, htmx fragments, CSV in and out,
reviewing a flag."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from billing import reconcile
from billing.models import Charge, DiscrepancyFlag, FlagStatus
from jobs.models import JobEvent
from tests.support.charges import bill
from tests.support.factories import InvoiceSyncFactory, JobFactory, make_attempt

HX = {"HTTP_HX_REQUEST": "true"}


def field_report_run(team, name: str, instance_id: int, *items: tuple[str, str, str]):
    """An ended 0.44 h run on a $0.40/h host two hours ago, billed with ITEMS that day."""
    start = timezone.now() - timedelta(hours=2)
    job = JobFactory(team=team, name=name)
    attempt, _ = make_attempt(
        job,
        state="ended",
        instance_id=instance_id,
        rented_at=start,
        registered_at=start,
        running_at=start,
        ended_at=start + timedelta(hours=0.44),
        dph_base=0.40,
        download_usd_per_gb=0.0439453125,
    )
    bill(attempt, *items, day=start.date())
    return job


@pytest.fixture
def ledger(cast):
    """Team A: one job billed for 15 GB of traffic its agent never saw, flagged."""
    now = timezone.now()
    start = now - timedelta(hours=2)
    job = field_report_run(
        cast.team_a,
        "qwen-qlora",
        555,
        ("gpu", "0.440 hours at $0.400/hour", "0.176"),
        ("bwd", "15.000 GB downloaded at $0.043945/GB", "0.659"),
    )
    other = JobFactory(team=cast.team_a, name="tiny-matched")
    make_attempt(other, state="ended", instance_id=556, rented_at=start, ended_at=start)
    InvoiceSyncFactory(team=cast.team_a, synced_until=now)
    reconcile.flag_discrepancies(cast.team_a, now=now)
    return job


def url(slug="team-a", rest=""):
    return f"/finance/{slug}/{rest}"


@pytest.mark.parametrize("who", ["finance", "admin"])
def test_finance_and_admins_see_the_summary(client, cast, ledger, who):
    client.force_login(getattr(cast, who))

    page = client.get(url())

    assert page.status_code == 200
    body = page.content.decode()
    assert "qwen-qlora" in body
    assert "traffic: 15.000 GB download billed vs 0.000 GB recorded" in body
    assert "over-billed" in body


@pytest.mark.parametrize("headers", [{}, HX])
def test_a_member_is_refused_and_an_outsider_told_nothing_exists(client, cast, ledger, headers):
    client.force_login(cast.member)
    assert client.get(url(), **headers).status_code == 403
    assert client.get(url(rest=f"jobs/{ledger.pk}/"), **headers).status_code == 403

    client.force_login(cast.outsider)
    assert client.get(url(), **headers).status_code == 404
    assert client.get(url(rest=f"jobs/{ledger.pk}/"), **headers).status_code == 404
    assert client.get(url(rest="export.csv"), **headers).status_code == 404


def test_an_outsiders_own_team_does_not_open_another_teams_job(client, cast, ledger):
    client.force_login(cast.outsider)  # admin of team B

    assert client.get(url("team-b", f"jobs/{ledger.pk}/")).status_code == 404


def test_filters_swap_only_the_job_table_with_htmx(client, cast, ledger):
    client.force_login(cast.finance)

    flagged = client.get(url(), {"status": "over_billed"}, **HX).content.decode()
    matched = client.get(url(), {"status": "matched"}, **HX).content.decode()
    by_name = client.get(url(), {"q": "tiny"}, **HX).content.decode()

    assert flagged.lstrip().startswith('<div id="job-table">')
    assert "<html" not in flagged
    assert "qwen-qlora" in flagged
    assert "tiny-matched" not in flagged
    assert "tiny-matched" in matched
    assert "qwen-qlora" not in matched
    assert "tiny-matched" in by_name
    assert "qwen-qlora" not in by_name


def test_the_drill_down_shows_charges_items_and_the_cost_basis(client, cast, ledger):
    client.force_login(cast.finance)

    body = client.get(url(rest=f"jobs/{ledger.pk}/")).content.decode()

    assert "instance-555" in body
    assert "15.000 GB downloaded at $0.043945/GB" in body
    assert "(invoiced)" in body


def test_an_item_whose_text_did_not_parse_says_unparsed_and_keeps_its_amount(client, cast):
    job = field_report_run(
        cast.team_a,
        "odd-wording",
        557,
        ("gpu", "0.440 hours at $0.400/hour", "0.176"),
        ("bwd", "Internet: download bandwidth", "0.659"),
    )
    InvoiceSyncFactory(team=cast.team_a, synced_until=timezone.now())
    client.force_login(cast.finance)

    body = client.get(url(rest=f"jobs/{job.pk}/")).content.decode()

    assert "Internet: download bandwidth" in body
    assert "unparsed" in body
    assert "$0.659" in body
    assert "download: $0.659 billed vs $0.00 recorded (item text unparsed)" in body


def test_the_export_has_one_row_per_attempt_with_the_difference(client, cast, ledger):
    client.force_login(cast.finance)

    reply = client.get(url(rest="export.csv"))

    assert reply["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(reply.content.decode())))
    flagged = next(r for r in rows if r["job"] == "qwen-qlora")
    assert flagged["status"] == "over_billed"
    assert float(flagged["billed_usd"]) == pytest.approx(0.835)
    assert float(flagged["download_billed_usd"]) == pytest.approx(0.659)


def test_exported_charges_upload_back_without_duplicates(client, cast, ledger):
    client.force_login(cast.finance)
    exported = client.get(url(rest="charges.csv")).content

    reply = client.post(
        url(rest="upload/"), {"file": SimpleUploadedFile("charges.csv", exported)}, follow=True
    )

    assert reply.status_code == 200
    assert "Imported 1 charges (2 items)" in reply.content.decode()
    assert Charge.objects.filter(team=cast.team_a).count() == 1


def test_a_malformed_upload_lists_line_numbers_and_imports_nothing(client, cast, ledger):
    client.force_login(cast.finance)
    before = Charge.objects.count()
    text = (
        "day,source,type,label,start,end,description,item_type,item_description,item_amount\n"
        "2026-03-01,instance-9,instance,,,,x,gpu,1.000 hours at $1.000/hour,1\n"
        "2026-03-01,instance-9,instance,,,,x,gpu,1.000 hours at $1.000/hour,one\n"
    )

    reply = client.post(url(rest="upload/"), {"file": SimpleUploadedFile("c.csv", text.encode())})

    assert reply.status_code == 400
    assert "line 3: item_amount is not a number" in reply.content.decode()
    assert Charge.objects.count() == before


def test_a_member_cannot_upload_or_review(client, cast, ledger):
    flag = DiscrepancyFlag.objects.get(attempt__job=ledger)
    client.force_login(cast.member)

    upload = client.post(url(rest="upload/"), {"file": SimpleUploadedFile("c.csv", b"x")})
    review = client.post(url(rest=f"flags/{flag.pk}/review/"), {"note": "fine"}, **HX)

    assert (upload.status_code, review.status_code) == (403, 403)
    flag.refresh_from_db()
    assert flag.status == FlagStatus.OPEN


def test_finance_marks_a_flag_reviewed_with_a_note_through_htmx(client, cast, ledger):
    flag = DiscrepancyFlag.objects.get(attempt__job=ledger)
    client.force_login(cast.finance)

    empty = client.post(url(rest=f"flags/{flag.pk}/review/"), {"note": ""}, **HX)
    done = client.post(
        url(rest=f"flags/{flag.pk}/review/"), {"note": "host charges traffic; accepted"}, **HX
    )

    assert empty.status_code == 400
    assert done.status_code == 200
    assert done.content.decode().startswith(f'<tr id="flag-{flag.pk}">')
    assert "Reviewed by fran: host charges traffic; accepted" in done.content.decode()
    flag.refresh_from_db()
    assert (flag.status, flag.reviewed_by, flag.note) == (
        FlagStatus.REVIEWED,
        cast.finance,
        "host charges traffic; accepted",
    )
    summary = client.get(url()).content.decode()
    assert f'id="flag-{flag.pk}"' not in summary  # off the open list


def test_the_flag_emitted_one_event_for_notifications(cast, ledger):
    events = JobEvent.objects.filter(job=ledger, kind="invoice_discrepancy")

    reconcile.flag_discrepancies(cast.team_a, now=timezone.now())

    (event,) = events
    assert event.data["status"] == "over_billed"
    assert "traffic" in event.message


def test_a_period_without_the_job_shows_none(client, cast, ledger):
    client.force_login(cast.finance)
    past = datetime(2020, 1, 1, tzinfo=UTC).date()

    body = client.get(url(), {"start": past, "end": past}, **HX).content.decode()

    assert "qwen-qlora" not in body
    assert "No jobs rented in this period" in body


def test_the_admin_lists_only_the_own_teams_ledger_read_only(client, cast, ledger):
    from django.urls import reverse

    from billing.models import Charge as ChargeModel

    other = JobFactory(team=cast.team_b)
    theirs, _ = make_attempt(other, state="ended", instance_id=777, rented_at=timezone.now())
    bill(theirs, ("gpu", "1.000 hours at $1.000/hour", "1.000"))
    client.force_login(cast.admin)

    listing = client.get(reverse("admin:billing_charge_changelist")).content.decode()
    theirs_page = client.get(
        reverse("admin:billing_charge_change", args=[ChargeModel.objects.get(instance_id=777).pk])
    )
    flags = client.get(reverse("admin:billing_discrepancyflag_changelist"))

    assert "instance-555" in listing
    assert "instance-777" not in listing
    assert theirs_page.status_code == 404
    assert flags.status_code == 200
    assert client.get(reverse("admin:billing_charge_add")).status_code == 403
