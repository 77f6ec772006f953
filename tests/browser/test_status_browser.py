"""The public status page in headless Chromium: it renders, the bar chart is visible and drawn,
the window switcher works, and on a 390 px phone the chart shows today's bar and the incident
history reads as labelled lines, with nothing scrolling sideways."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from tests.support.factories import InterruptionFactory, JobFactory, TeamFactory, make_attempt

pytestmark = pytest.mark.browser


@pytest.fixture
def public_team(transactional_db):
    cache.clear()  # the live server shares this process's cache; start from fresh numbers
    team = TeamFactory(name="Open Lab", slug="open-lab", public_status_page=True)
    job = JobFactory(team=team)
    now = timezone.now()
    for number, days_ago in enumerate([0, 2, 2, 5, 20], start=1):
        attempt, _ = make_attempt(job, number=number, state="ended")
        detected = now - timedelta(days=days_ago, minutes=5)
        InterruptionFactory(
            attempt=attempt,
            cause="heartbeat_timeout",
            detected_at=detected,
            last_heartbeat_at=detected - timedelta(seconds=30),
            replacement_rented_at=detected + timedelta(seconds=60 * number),
            running_again_at=detected + timedelta(seconds=60 * number + 240),
            resumed_step=50 * number,
        )
    yield team
    cache.clear()


def test_the_status_page_renders_with_its_chart(live_server, public_team, browser_page):
    page = browser_page
    page.goto(f"{live_server.url}/status/open-lab/")

    assert page.title() == "Open Lab status · NomadGPU"
    chart = page.locator("#daily-chart")
    chart.wait_for(state="visible")
    box = chart.bounding_box()
    assert box is not None
    assert box["width"] > 300
    assert box["height"] > 50
    bars = page.locator("#daily-chart rect.bar")
    assert bars.count() == 30
    heights = [bars.nth(i).bounding_box()["height"] for i in range(bars.count())]
    assert sum(h > 0 for h in heights) == 4  # four days had interruptions, one of them two
    assert max(heights) == pytest.approx(2 * min(h for h in heights if h > 0), rel=0.01)
    assert page.locator("#n-interruptions").inner_text() == "5"
    assert page.locator("tr[id^=incident-]").count() == 5

    page.get_by_role("link", name="7 days").click()
    page.wait_for_url("**/status/open-lab/?days=7")
    assert page.locator("#daily-chart rect.bar").count() == 7
    assert page.locator("#n-interruptions").inner_text() == "4"
    assert page.get_by_role("link", name="7 days").get_attribute("aria-current") == "page"


PHONE = {"width": 390, "height": 844}


@pytest.mark.parametrize("days", [30, 90])
def test_on_a_phone_the_chart_shows_every_day_to_todays_bar(
    live_server, public_team, browser_page, days
):
    page = browser_page
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/status/open-lab/?days={days}")

    page.locator("#daily-chart").wait_for(state="visible")
    bars = page.locator("#daily-chart rect.bar")
    assert bars.count() == days
    today = bars.last
    assert today.locator("title").text_content().startswith(f"{timezone.localdate():%a %d %b %Y}:")
    boxes = bars.evaluate_all("bs => bs.map(b => b.getBoundingClientRect().toJSON())")
    for box in (boxes[0], boxes[-1]):  # the oldest day's slot and today's, both on screen
        assert box["left"] >= 0
        assert box["right"] <= PHONE["width"]
    drawn = [b for b in boxes if b["height"] > 0]
    assert len(drawn) == 4  # the four days with interruptions
    assert all(b["height"] > 10 for b in drawn)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_on_a_phone_each_incident_reads_as_labelled_lines(live_server, public_team, browser_page):
    page = browser_page
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/status/open-lab/")

    table = page.locator("#incident-table")
    table.wait_for(state="visible")
    # Nothing to scroll sideways: the table fits its box and the box fits the screen.
    assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth")
    assert table.bounding_box()["x"] + table.bounding_box()["width"] <= PHONE["width"]
    cells = page.locator("tr[id^=incident-] td")
    assert cells.count() == 5 * 5
    for i in range(cells.count()):
        box = cells.nth(i).bounding_box()
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= PHONE["width"]
    first = page.locator("tr[id^=incident-]").first.locator("td")
    labels = [
        first.nth(i).evaluate("td => getComputedStyle(td, '::before').content")
        for i in range(first.count())
    ]
    assert labels == [
        '"Detected (UTC)"',
        '"Cause"',
        '"Back on a machine after"',
        '"Training again after"',
        '"Resumed from step"',
    ]
    assert "heartbeats stopped" in first.nth(1).inner_text()
