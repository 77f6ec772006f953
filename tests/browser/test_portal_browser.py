"""The portal in headless Chromium against the whole supervisor on the sandbox: a member logs in,
previews offers and submits the toy job from its template, watches it progress without a page
reload, sees an injected host loss and the recovery on the timeline, and cancels the job.

The supervisor fixtures (live server, sandbox, Celery worker thread, watchdog tick thread) come
from ``tests/support/supervisor.py``. A failing test leaves a screenshot under
``$NOMADGPU_VAR_DIR/screenshots``.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from django.conf import settings

from nomadgpu.models import Role
from tests.support.factories import MembershipFactory
from tests.support.supervisor import celery_worker_thread, sandbox, supervisor  # noqa: F401

# Playwright's sync API runs an event loop in this thread; Django would refuse DB access.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests-only"  # tests.support.factories.UserFactory's


@pytest.fixture
def portal_member(supervisor):  # noqa: F811
    """The supervisor's user as an admin of its team (written before the browser starts)."""
    MembershipFactory(team=supervisor.team, user=supervisor.user, role=Role.ADMIN)
    return supervisor.user


@pytest.fixture
def portal_page(browser_page):
    """``browser_page`` (tests/browser/conftest.py) with a longer default timeout: the live
    parts of the portal poll every 3 s. Request it after the fixtures that write data."""
    browser_page.set_default_timeout(20_000)
    return browser_page


def shown_step(page) -> int:
    text = (
        page.locator("#job-step").text_content(timeout=1_000)
        if page.locator("#job-step").count()
        else ""
    )
    return int(text) if text and text.strip().isdigit() else -1


def wait_for_step(page, above: int, *, timeout: float) -> int:
    """Poll the page (never the database) until it shows a step above ABOVE."""
    deadline = time.monotonic() + timeout
    while (step := shown_step(page)) <= above:
        if time.monotonic() > deadline:
            pytest.fail(f"the job page did not show a step above {above} within {timeout:.0f}s")
        page.wait_for_timeout(200)
    return step


def instance_of(box, job_id: int) -> int:
    """The sandbox instance running JOB_ID, found by its label over the Vast API."""
    from hosts.vast import VastClient
    from tests.support.sandbox import DEFAULT_KEY

    prefix = f"ngpu:{settings.NOMADGPU_ENV}:{job_id}:"
    with VastClient(DEFAULT_KEY, box.url) as client:
        found = [i for i in client.list_instances() if (i.label or "").startswith(prefix)]
    assert len(found) == 1, f"expected one instance for job {job_id}, found {found}"
    return found[0].id


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")


def test_a_member_submits_the_toy_job_watches_it_recover_from_a_host_loss_and_cancels_it(
    supervisor,  # noqa: F811
    portal_member,
    live_server,
    portal_page,
):
    from playwright.sync_api import expect

    page, base = portal_page, live_server.url
    log_in(page, base, portal_member.username)

    page.goto(f"{base}/jobs/new/?template=toy")
    expect(page.get_by_label("Name", exact=True)).to_have_value("toy")
    page.get_by_label("Heartbeat interval (s)").fill("1")
    page.evaluate("window.noReload = true")
    page.get_by_role("button", name="Preview offers and cost").click()
    expect(page.locator("#estimate")).to_contain_text("$")
    expect(page.locator("#preview tr.chosen")).to_contain_text("RTX 4090")
    assert page.evaluate("window.noReload") is True  # htmx swapped the form in place

    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.evaluate("window.noReload = true")

    expect(page.locator("#job-status")).to_contain_text("Running", timeout=90_000)
    first = wait_for_step(page, 0, timeout=30)
    later = wait_for_step(page, max(first, 60), timeout=60)  # past the first checkpoint
    assert page.evaluate("window.noReload") is True  # the steps arrived by polling fragments
    assert later > first

    supervisor.sandbox.inject(instance_of(supervisor.sandbox, job_id), "destroy")

    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("host lost", timeout=60_000)
    expect(timeline.locator(".interruption")).to_contain_text("Detected")
    expect(timeline).to_contain_text("running again", timeout=120_000)
    expect(timeline.locator(".interruption")).to_contain_text("resumed from step")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-status")).to_contain_text("Cancelled")
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    expect(timeline).to_contain_text("cancelled")
