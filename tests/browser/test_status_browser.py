"""The public status page in headless Chromium: it renders, the bar chart is visible and drawn,
the window switcher works, and a phone-sized screen does not scroll sideways."""

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


def test_the_status_page_fits_a_phone_screen(live_server, public_team, browser_page):
    page = browser_page
    page.set_viewport_size({"width": 375, "height": 740})
    page.goto(f"{live_server.url}/status/open-lab/?days=90")

    page.locator("#daily-chart").wait_for(state="visible")
    # The chart keeps a legible minimum width and scrolls inside its own box, not the page.
    assert page.locator("#daily-chart-wrap").bounding_box()["width"] <= 375
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
