"""What the portal's pages put in front of each role, through the test client: the navigation
each role can use, the team's finance URL, job lists newest first with id and submitted time,
the dashboard's live count, and what the progress line and the loss card say before there is
a step or a chart."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job
from nomadgpu import api_tokens
from tests.support.factories import JobFactory, LossPointFactory, make_attempt

pytestmark = pytest.mark.django_db


def nav(html: str) -> dict[str, str]:
    """The main navigation's links, {text: href}."""
    block = re.search(r'<nav aria-label="Main">(.*?)</nav>', html, re.S).group(1)
    links = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', block)
    return {text.strip(): href for href, text in links}


# ---- navigation per role ---------------------------------------------------------------------


@pytest.mark.parametrize("role", ["finance", "admin"])
def test_finance_and_admins_find_the_finance_page_in_the_navigation(client, cast, role):
    client.force_login(getattr(cast, role))

    links = nav(client.get(reverse("dashboard")).content.decode())

    assert links["Finance"] == "/finance/team-a/"
    assert client.get(links["Finance"]).status_code == 200


def test_a_member_gets_no_finance_link_since_billing_is_closed_to_members(client, cast):
    client.force_login(cast.member)

    links = nav(client.get(reverse("dashboard")).content.decode())

    assert "Finance" not in links
    assert client.get("/finance/team-a/").status_code == 403


@pytest.mark.parametrize("role", ["member", "finance", "admin"])
def test_every_role_may_submit_so_every_role_sees_new_job(client, cast, role):
    # nomadgpu/permissions.py gates billing (finance, admin) and team management (admin);
    # submitting is open to every role of the team, finance included.
    client.force_login(getattr(cast, role))

    links = nav(client.get(reverse("job-list")).content.decode())

    assert links["New job"] == "/jobs/new/"
    assert client.get(links["New job"]).status_code == 200
    assert ("Admin" in links) == (role == "admin")


def test_the_finance_link_marks_itself_current_on_the_finance_pages(client, cast):
    client.force_login(cast.finance)

    html = client.get("/finance/team-a/").content.decode()

    assert re.search(r'<a href="/finance/team-a/" aria-current="page">Finance</a>', html)


# ---- the team's finance URL ------------------------------------------------------------------


def test_the_teams_finance_url_leads_to_the_finance_page_with_its_filters(client, cast):
    client.force_login(cast.finance)

    response = client.get("/teams/team-a/finance/?status=matched")

    assert response.status_code == 302
    assert response["Location"] == "/finance/team-a/?status=matched"
    assert client.get(response["Location"]).status_code == 200


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("outsider", 404)])
def test_the_teams_finance_url_opens_nothing_the_role_could_not_open(client, cast, who, status):
    client.force_login(getattr(cast, who))

    assert client.get("/teams/team-a/finance/", follow=True).status_code == status


# ---- job lists: newest first, with id and submitted time --------------------------------------


@pytest.fixture
def two_toys(cast):
    """Two jobs named alike, submitted in the same moment, and an older one."""
    now = timezone.now()
    older = JobFactory(team=cast.team_a, name="qlora", created_at=now - timedelta(hours=2))
    first = JobFactory(team=cast.team_a, name="toy", created_at=now)
    second = JobFactory(team=cast.team_a, name="toy", created_at=now)
    return [second, first, older]  # newest first: the later id breaks the tie


def listed_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td class="num muted">#(\d+)</td>', html)]


@pytest.mark.parametrize("page", ["dashboard", "job-list"])
def test_job_lists_are_newest_first_with_id_and_submitted_time(client, cast, two_toys, page):
    client.force_login(cast.member)

    html = client.get(reverse(page)).content.decode()

    assert listed_ids(html) == [j.pk for j in two_toys]
    for job in two_toys:
        local = timezone.localtime(job.created_at)
        assert f'<time datetime="{local.isoformat()}">{local:%Y-%m-%d %H:%M}</time>' in html
    assert re.search(r"<th[^>]*>ID</th><th[^>]*>Job</th><th[^>]*>Submitted</th>", html)


def test_the_team_page_lists_its_jobs_newest_first(client, cast, two_toys):
    client.force_login(cast.member)

    html = client.get(reverse("team-detail", args=["team-a"])).content.decode()

    assert listed_ids(html) == [j.pk for j in two_toys]


def test_the_api_lists_jobs_newest_first_with_id_and_submitted_time(client, cast, two_toys):
    token = api_tokens.create_token(user=cast.member, name="t", now=timezone.now())[1]

    jobs = client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}").json()

    assert [j["id"] for j in jobs] == [j.pk for j in two_toys]
    assert all(j["created_at"] for j in jobs)


# ---- the dashboard's counts ------------------------------------------------------------------


def test_the_dashboard_counts_only_jobs_on_or_getting_a_host_as_live(client, cast):
    for state in ("queued", "running", "recovering", "paused_budget", "needs_attention"):
        JobFactory(team=cast.team_a, state=state)
    JobFactory(team=cast.team_a, state="succeeded")
    JobFactory(team=cast.team_b, state="running")  # another team's
    client.force_login(cast.member)

    html = client.get(reverse("dashboard")).content.decode()

    assert re.search(r'id="n-live"[^>]*>3<', html)
    assert re.search(r'id="n-paused"[^>]*>1<', html)
    assert re.search(r'id="n-attention"[^>]*>1<', html)
    assert Job.objects.filter(team=cast.team_a).unfinished().count() == 5  # what it said before


# ---- before the first step, before the chart --------------------------------------------------


@pytest.fixture
def member(client, cast):
    client.force_login(cast.member)
    return client


def job_page(client, job) -> str:
    return client.get(reverse("job-detail", args=[job.pk])).content.decode()


def test_a_job_with_a_host_and_no_step_is_waiting_for_the_first_step(member, cast):
    job = JobFactory(team=cast.team_a, total_steps=600)
    make_attempt(job, state="running")

    page = job_page(member, job)
    listing = member.get(reverse("job-list")).content.decode()

    assert re.search(r'<span id="job-waiting">waiting for the first step of 600</span>', page)
    assert "waiting for the first step" in listing
    assert "?%" not in page
    assert "-/600" not in page


def test_a_finished_job_without_a_step_is_not_said_to_wait(member, cast):
    job = JobFactory(team=cast.team_a, total_steps=600, state="cancelled")

    assert "waiting for the first step" not in job_page(member, job)
    assert "waiting for the first step" not in member.get(reverse("job-list")).content.decode()


def test_the_loss_card_shows_the_reported_loss_before_the_chart_has_two_samples(member, cast):
    job = JobFactory(team=cast.team_a, total_steps=600)
    make_attempt(job, state="running", step=3, total_steps=600, loss=2.3025851)
    LossPointFactory(job=job, step=1, loss=2.31)  # one sample: no line to draw yet

    page = job_page(member, job)

    assert 'id="job-loss">2.303<' in page  # the progress line
    latest = re.search(r'id="loss-latest">(.*?)</p>', page, re.S).group(1)
    assert re.sub(r"<[^>]+>", "", latest).startswith("Latest loss 2.303 at step 3.")
    assert "one every 6 steps" in page
    assert "No loss reported yet." not in page


def test_the_loss_card_draws_the_chart_from_two_samples(member, cast):
    job = JobFactory(team=cast.team_a, total_steps=600)
    make_attempt(job, state="running", step=7, total_steps=600, loss=2.1)
    LossPointFactory(job=job, step=1, loss=2.31)
    LossPointFactory(job=job, step=6, loss=2.2)

    page = job_page(member, job)

    assert 'aria-label="Training loss by step' in page
    assert 'id="loss-latest"' not in page


def test_the_loss_card_says_no_loss_only_when_none_was_reported(member, cast):
    job = JobFactory(team=cast.team_a, total_steps=600)
    make_attempt(job, state="running", step=3)

    assert "No loss reported yet." in job_page(member, job)
