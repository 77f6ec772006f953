"""Finance imports when finance wants it: the "Import now" button (finance and admin; a member
is refused) sends the beat's own task after the commit, a real worker on the real broker runs
it once against Vast's billing endpoints (``tests/support/vast_billing_fake.py``), and
``manage.py sync_invoices`` runs the same import in-process, idempotent as the beat's."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from billing.models import Charge, ChargeItem, InvoiceSync
from tests.support.factories import InvoiceSyncFactory, JobFactory, make_attempt
from tests.support.processes import wait_until
from tests.support.vast_billing_fake import FakeVastBilling, charge

IMPORT_URL = "/finance/team-a/import/"


def on_the_fake(team, fake: FakeVastBilling, *, instance_id: int = 7101) -> None:
    """TEAM's Vast account is FAKE, which bills one ended attempt of TEAM's for yesterday."""
    team.vast_url, team.vast_api_key = fake.url, "billing-key"
    team.save()
    yesterday = (timezone.now() - timedelta(days=1)).astimezone(UTC)
    rented = datetime.combine(yesterday.date(), datetime.min.time(), tzinfo=UTC) + timedelta(
        hours=9
    )
    job = JobFactory(team=team)
    make_attempt(
        job,
        state="ended",
        instance_id=instance_id,
        rented_at=rented,
        registered_at=rented,
        ended_at=rented + timedelta(hours=0.5),
        dph_base=0.4,
    )
    fake.charges = [charge(instance_id, yesterday.date(), gpu_h=0.5)]


def payments_calls(fake: FakeVastBilling) -> int:
    """How many imports reached Vast: each asks for the payments exactly once."""
    return sum(1 for c in fake.calls if c["path"].rstrip("/") == "/api/v1/invoices")


# --- the button ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["finance", "admin"])
def test_finance_and_admins_see_the_import_now_button(client, cast, who):
    client.force_login(getattr(cast, who))

    body = client.get("/finance/team-a/").content.decode()

    assert f'action="{IMPORT_URL}"' in body
    assert ">Import now</button>" in body
    assert "Not imported from Vast yet." in body


@pytest.mark.django_db
def test_a_member_is_refused_the_import_and_an_outsider_told_nothing_exists(
    client, cast, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        client.force_login(cast.member)
        refused = client.post(IMPORT_URL)
        client.force_login(cast.outsider)
        hidden = client.post(IMPORT_URL)

    assert refused.status_code == 403
    assert hidden.status_code == 404
    assert callbacks == []  # nothing was queued


@pytest.mark.django_db
def test_the_import_is_only_a_post(client, cast):
    client.force_login(cast.finance)

    assert client.get(IMPORT_URL).status_code == 405


@pytest.mark.django_db
def test_the_page_shows_when_the_last_import_ran_and_its_error(client, cast):
    ran = datetime(2026, 3, 8, 12, 0, 5, tzinfo=UTC)
    InvoiceSyncFactory(team=cast.team_a, last_run_at=ran, last_error="upstream broke")
    client.force_login(cast.finance)

    body = client.get("/finance/team-a/").content.decode()

    assert "Last import 2026-03-08 12:00:05 UTC" in body
    assert "failed: upstream broke" in body


def test_import_now_sends_the_beats_task_after_the_commit_and_a_worker_runs_it_once(
    client, cast, vast_billing, celery_worker_thread, django_capture_on_commit_callbacks
):
    on_the_fake(cast.team_a, vast_billing)
    client.force_login(cast.finance)

    # A transaction of the test's own: the request's commit is this block's end.
    with transaction.atomic():
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = client.post(IMPORT_URL, follow=True)
        assert len(callbacks) == 1
        assert payments_calls(vast_billing) == 0  # not before the commit
    # The import's last step is the matching (the sync row is written just before it).
    wait_until(
        lambda: Charge.objects.filter(team=cast.team_a, attempt__isnull=False).exists(),
        timeout=60,
        what="the worker to run the queued import to its end",
    )

    assert response.status_code == 200
    assert "Import queued at" in response.content.decode()
    assert Charge.objects.filter(team=cast.team_a, source="instance-7101").count() == 1
    assert InvoiceSync.objects.get(team=cast.team_a).last_run_at is not None  # as the beat's
    assert payments_calls(vast_billing) == 1  # one task, run once


# --- the command --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_command_imports_a_team_and_a_second_run_changes_nothing(cast, vast_billing):
    on_the_fake(cast.team_a, vast_billing)
    out = io.StringIO()

    call_command("sync_invoices", "--team", "team-a", stdout=out)
    first = list(ChargeItem.objects.values_list("charge__source", "type", "amount"))
    InvoiceSync.objects.filter(team=cast.team_a).update(charges_complete_through=None)
    call_command("sync_invoices", "--team", "team-a", stdout=io.StringIO())

    assert "team-a:" in out.getvalue()
    assert "1 matched" in out.getvalue()
    assert first == [("instance-7101", "gpu", Decimal("0.2"))]
    assert list(ChargeItem.objects.values_list("charge__source", "type", "amount")) == first
    assert Charge.objects.count() == 1
    assert InvoiceSync.objects.get(team=cast.team_a).last_error == ""
    assert not InvoiceSync.objects.filter(team=cast.team_b).exists()  # only the team asked


@pytest.mark.django_db
def test_the_command_says_which_team_failed_and_keeps_the_error_for_the_page(cast, vast_billing):
    on_the_fake(cast.team_a, vast_billing)
    vast_billing.fail_days = {(timezone.now() - timedelta(days=1)).astimezone(UTC).date()}

    with pytest.raises(CommandError, match="team-a"):
        call_command("sync_invoices", "--team", "team-a", stdout=io.StringIO())

    assert "upstream broke" in InvoiceSync.objects.get(team=cast.team_a).last_error


@pytest.mark.django_db
def test_the_command_refuses_an_unknown_team(cast):
    with pytest.raises(CommandError, match="no team 'nope'"):
        call_command("sync_invoices", "--team", "nope")
