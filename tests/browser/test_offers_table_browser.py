"""The offers table in headless Chromium at a laptop's 1280 px: the Total column, which the
headline quotes, is in view without scrolling, on the new-job preview (the shipped market through
the sandbox) and on the job page's "Host and why" (a stored rent decision)."""

from __future__ import annotations

import pytest

from hosts import selection
from jobs.job_templates import template_spec
from jobs.renting.terms import profile_from_spec, requirements_from_spec
from jobs.spec import JobSpec
from portal import figures
from tests.support.factories import JobFactory, make_attempt
from tests.support.market import load_market
from tests.support.sandbox import DEFAULT_KEY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests-only"  # tests.support.factories.UserFactory's
LAPTOP = {"width": 1280, "height": 800}

# True when CELL can be seen where it is: inside the window, and not hidden by the table's
# scroll box (the point at its centre hits the cell itself). Only the page scrolls, vertically,
# to bring it up: scrolling the cell into view would also scroll the table's box sideways.
IN_VIEW = """cell => {
  window.scrollTo(0, cell.getBoundingClientRect().top + window.scrollY - 100);
  const r = cell.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return r.left >= 0 && r.right <= window.innerWidth && cell.contains(hit)
    && cell.closest('.table-wrap').scrollLeft === 0;
}"""


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")


def totals_in_view(page) -> list[bool]:
    cells = page.locator("table.offers tbody td.total")
    assert cells.count() > 1
    return [cells.nth(i).evaluate(IN_VIEW) for i in range(cells.count())]


def test_the_previews_total_column_is_in_view_at_1280_px(
    cast, sandbox, settings, live_server, browser_page
):
    from playwright.sync_api import expect

    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    page, base = browser_page, live_server.url
    page.set_viewport_size(LAPTOP)
    log_in(page, base, cast.member.username)

    page.goto(f"{base}/jobs/new/?template=toy")
    page.get_by_role("button", name="Preview offers and cost").click()
    expect(page.locator("#estimate")).to_contain_text("$", timeout=20_000)

    assert all(totals_in_view(page))
    chosen_total = page.locator("table.offers tr.chosen td.total").inner_text()
    assert chosen_total == page.locator("#estimate").inner_text()  # the headline's figure
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]


@pytest.fixture
def job_with_offers(cast):
    """A running toy job whose stored rent decision ranked the shipped market's offers."""
    spec = JobSpec.model_validate(template_spec("toy"))
    offers, _ = load_market()
    decision = selection.choose_offer(
        offers,
        requirements_from_spec(spec.requirements),
        profile_from_spec(spec.profile, steps_total=spec.total_steps or 0),
        top_n=figures.PREVIEW_TOP_N,
    ).as_dict()
    job = JobFactory(team=cast.team_a, name="toy", total_steps=300)
    bid = decision["rental"]["gpu_usd_per_hour"]
    make_attempt(job, state="running", gpu_name="RTX 4090", dph_base=bid, decision=decision)
    return job


def test_the_job_pages_total_column_is_in_view_at_1280_px(
    cast, job_with_offers, live_server, browser_page
):
    page, base = browser_page, live_server.url
    page.set_viewport_size(LAPTOP)
    log_in(page, base, cast.member.username)

    page.goto(f"{base}/jobs/{job_with_offers.pk}/")

    assert all(totals_in_view(page))
    assert page.locator("table.offers th", has_text="Total $").evaluate(IN_VIEW)
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
