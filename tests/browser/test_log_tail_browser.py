"""The job page's log tail in headless Chromium: it opens at its last line, stays there while
htmx swaps in the lines new heartbeats bring, and leaves a reader who scrolled up in place.

New lines arrive the way they do in production: the agent's heartbeat, through the agent API
of the live server, so the test thread never touches the database once the browser runs."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from nomadgpu.models import Role
from tests.support.factories import JobFactory, MembershipFactory, make_attempt

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests-only"  # tests.support.factories.UserFactory's


def lines(last: int) -> str:
    return "\n".join(f"step {n}/300 loss 0.{n:04d}" for n in range(1, last + 1))


@pytest.fixture
def member(transactional_db):
    return MembershipFactory(role=Role.MEMBER, user__username="lena").user


def job_with_log(member, *, state: str, last_line: str = ""):
    """A job of MEMBER's team whose attempt has 40 lines of log (and LAST_LINE)."""
    team = member.memberships.get().team
    job = JobFactory(team=team, state=state, total_steps=300)
    now = timezone.now()
    tail = lines(40) + (f"\n{last_line}" if last_line else "")
    attempt_state = "running" if state == "running" else "ended"
    return make_attempt(
        job,
        state=attempt_state,
        step=40,
        total_steps=300,
        log_tail=tail,
        registered_at=now,
        last_heartbeat_at=now,
        heartbeat_deadline=now + timedelta(hours=1),
    )


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")


def at_end(page) -> bool:
    return page.evaluate(
        "() => { const el = document.querySelector('#log-tail');"
        " return el.scrollHeight - el.scrollTop - el.clientHeight <= 4; }"
    )


def scroll_top(page) -> float:
    return page.evaluate("() => document.querySelector('#log-tail').scrollTop")


def heartbeat(base: str, token: str, seq: int, last: int) -> None:
    """What the agent sends: the rolling tail, now up to line LAST."""
    body = {"seq": seq, "phase": "running", "step": last, "gpu": {"ok": True}}
    response = httpx.post(
        f"{base}/api/agent/heartbeat",
        json={**body, "log_tail": lines(last)},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text


def test_a_finished_jobs_log_opens_at_its_last_line(live_server, member, browser_page):
    (attempt, _) = job_with_log(member, state="succeeded", last_line="exit code 0")
    page = browser_page
    log_in(page, live_server.url, member.username)

    page.goto(f"{live_server.url}/jobs/{attempt.job_id}/")
    page.locator("#log-tail").wait_for(state="visible")

    assert page.evaluate("() => document.querySelector('#log-tail').scrollHeight") > (
        page.locator("#log-tail").bounding_box()["height"] + 100
    )  # the tail is taller than its box: there is something to scroll
    assert at_end(page)
    assert page.get_by_text("exit code 0").is_visible()


def test_new_lines_keep_the_tail_pinned_unless_the_reader_scrolled_up(
    live_server, member, browser_page
):
    from playwright.sync_api import expect

    attempt, token = job_with_log(member, state="running")
    page, base = browser_page, live_server.url
    log_in(page, base, member.username)
    page.goto(f"{base}/jobs/{attempt.job_id}/")
    log = page.locator("#log-tail")
    assert at_end(page)

    heartbeat(base, token, 1, 45)
    expect(log).to_contain_text("step 45/300", timeout=15_000)  # the 3 s poll swapped it in
    assert at_end(page)

    page.evaluate("() => { document.querySelector('#log-tail').scrollTop = 0; }")
    heartbeat(base, token, 2, 50)
    expect(log).to_contain_text("step 50/300", timeout=15_000)
    assert scroll_top(page) == 0  # reading the start: left there
    assert not at_end(page)

    page.evaluate(
        "() => { const el = document.querySelector('#log-tail'); el.scrollTop = el.scrollHeight; }"
    )
    heartbeat(base, token, 3, 55)
    expect(log).to_contain_text("step 55/300", timeout=15_000)
    assert at_end(page)  # back at the end: pinned again
