"""What a team's people do from the job page, in headless Chromium against the live server:
an admin runs a fire drill ("Simulate host loss", confirmed in the browser's dialog) and sees
it on the timeline; a member whose job a limit paused reads who can raise it, asks to resume,
and the admin finds the ask on their pages and among the team's notification deliveries.

All data is written before the browser starts (tests/browser/conftest.py); afterwards the test
reads only what the pages show."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import enforce
from tests.support.factories import ChannelFactory, JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests-only"  # tests.support.factories.UserFactory's
ASK = 16018470  # an RTX 4090 of the sandbox market


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")


def log_out(page) -> None:
    page.get_by_role("button", name="Log out").click()


@pytest.fixture
def running_on_sandbox(cast, sandbox, settings):
    """Team A's job training on a sandbox instance; (job id, instance id)."""
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = DEFAULT_KEY
    instance_id = sandbox.create(ASK, onstart="sleep 600")
    job = JobFactory(team=cast.team_a, name="drilled", state="running", total_steps=300)
    now = timezone.now()
    make_attempt(
        job,
        state="running",
        instance_id=instance_id,
        registered_at=now,
        last_heartbeat_at=now,
        heartbeat_deadline=now + timedelta(hours=1),
    )
    return job.pk, instance_id


@pytest.fixture
def paused_job(cast, settings):
    """Bob's job, paused by its own $0.0800 limit (it does not roll over: no midnight in the
    test), and a webhook channel of the team; the job's id."""
    settings.WATCHDOG_INTERVAL_S = 5
    now = timezone.now()
    since = now - timedelta(seconds=792)  # $0.0792 at $0.36/h
    job = JobFactory(
        team=cast.team_a,
        name="tight",
        state="running",
        created_at=since,
        created_by=cast.member,
        total_steps=1000,
        budget_usd=Decimal("0.080"),
    )
    make_attempt(job, state="running", dph_base=0.36, rented_at=since, registered_at=since)
    enforce.budget_pass(now=now)
    enforce.budget_pass(now=now + timedelta(seconds=5))
    job.refresh_from_db()
    assert job.state == "paused_budget"
    ChannelFactory(team=cast.team_a, name="ops webhook")
    return job.pk


def test_an_admin_simulates_a_host_loss_and_the_timeline_shows_the_drill(
    cast, running_on_sandbox, live_server, browser_page
):
    from playwright.sync_api import expect

    job_id, instance_id = running_on_sandbox
    page, base = browser_page, live_server.url
    page.set_default_timeout(20_000)
    log_in(page, base, "alice")
    page.goto(f"{base}/jobs/{job_id}/")

    dialogs: list[str] = []

    def accept(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.get_by_role("button", name="Simulate host loss").click()

    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text(
        f"fire drill: instance {instance_id} destroyed by alice (portal) before its first step"
    )
    expect(page.locator(".flash")).to_contain_text(
        f"Fire drill: instance {instance_id} of attempt 1 destroyed before its first step."
    )
    assert [d[:32] for d in dialogs] == ["Destroy the host of drilled now,"]
    assert "None" not in timeline.text_content()


def test_a_member_of_a_paused_job_asks_to_resume_and_the_admin_is_told(
    cast, paused_job, live_server, browser_page
):
    from playwright.sync_api import expect

    page, base = browser_page, live_server.url
    page.set_default_timeout(20_000)
    log_in(page, base, "bob")
    page.goto(f"{base}/jobs/{paused_job}/")

    paused = page.locator("#job-paused")
    expect(paused).to_contain_text("Paused by a spending limit:")
    expect(paused).to_contain_text("Only a team admin can raise it: alice.")
    expect(paused.get_by_role("link", name="alice")).to_have_attribute(
        "href", "/teams/team-a/#members"
    )
    expect(page.get_by_role("button", name="Resume", exact=True)).to_have_count(0)
    page.get_by_role("button", name="Ask to resume").click()

    expect(page.locator(".flash")).to_contain_text(
        "Asked alice to resume tight: they see it on their portal pages, and 1 notification "
        "channel got it."
    )
    expect(paused).to_contain_text("bob asked the team's admins to resume it at")
    expect(page.get_by_role("button", name="Ask to resume")).to_have_count(0)
    expect(page.locator("#timeline")).to_contain_text("bob asks the team's admins (alice)")

    log_out(page)
    log_in(page, base, "alice")
    expect(page.locator("#budget-banner")).to_contain_text("bob asked to resume it at")
    page.goto(f"{base}/jobs/{paused_job}/")
    expect(page.locator("#resume-asked")).to_contain_text("bob asked to resume it at")
    expect(page.get_by_role("button", name="Resume", exact=True)).to_be_visible()
    page.goto(f"{base}/admin/notify/delivery/")
    expect(page.locator("#result_list")).to_contain_text(re.compile(r"resume.asked", re.I))
    expect(page.locator("#result_list")).to_contain_text("ops webhook")
