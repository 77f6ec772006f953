"""Every portal job view for each role: members, finance and admins of the job's team see and
act; an outsider (another team's admin) gets 404 and changes nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support.factories import CheckpointFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db
INSIDERS = ["admin", "member", "finance"]


@pytest.fixture
def job(cast):
    job = JobFactory(team=cast.team_a, total_steps=10)
    make_attempt(job, state="running")
    return job


def ready_checkpoint(job):
    return CheckpointFactory(
        attempt=job.attempts.get(),
        step=5,
        state="ready",
        key=f"{job.storage_prefix}attempts/1/checkpoints/5/c.tar",
    )


READ_VIEWS = [
    ("job-detail", lambda job: [job.id]),
    ("job-cancel", lambda job: [job.id]),  # GET: the confirmation page
]


@pytest.mark.parametrize("role", INSIDERS)
@pytest.mark.parametrize(("name", "args"), READ_VIEWS)
def test_team_roles_see_the_job_pages(client, cast, job, role, name, args):
    client.force_login(getattr(cast, role))

    assert client.get(reverse(name, args=args(job))).status_code == 200


@pytest.mark.parametrize(("name", "args"), READ_VIEWS)
def test_an_outsider_gets_404_for_the_job_pages(client, cast, job, name, args):
    client.force_login(cast.outsider)

    assert client.get(reverse(name, args=args(job))).status_code == 404


@pytest.mark.parametrize("htmx", [False, True])
def test_an_outsider_gets_404_for_the_live_fragment(client, cast, job, htmx):
    client.force_login(cast.outsider)
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}

    assert client.get(reverse("job-detail", args=[job.id]), **headers).status_code == 404


@pytest.mark.parametrize("role", INSIDERS)
def test_team_roles_may_cancel(client, cast, job, role):
    client.force_login(getattr(cast, role))

    client.post(reverse("job-cancel", args=[job.id]), {"confirm": "yes"})

    job.refresh_from_db()
    assert job.state == "cancelled"


def test_an_outsider_cannot_cancel(client, cast, job):
    client.force_login(cast.outsider)

    response = client.post(reverse("job-cancel", args=[job.id]), {"confirm": "yes"})

    job.refresh_from_db()
    assert response.status_code == 404
    assert job.state == "running"


def test_an_outsider_cannot_download_a_checkpoint(client, cast, job):
    checkpoint = ready_checkpoint(job)
    client.force_login(cast.outsider)

    response = client.get(reverse("checkpoint-download", args=[job.id, checkpoint.id]))

    assert response.status_code == 404


@pytest.mark.parametrize("role", INSIDERS)
def test_team_roles_may_download_a_checkpoint(client, cast, job, role, settings, tmp_path):
    from nomadgpu.storage import object_store

    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    checkpoint = ready_checkpoint(job)
    object_store(job.team).put_bytes(checkpoint.key, b"x")
    client.force_login(getattr(cast, role))

    response = client.get(reverse("checkpoint-download", args=[job.id, checkpoint.id]))

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"x"


@pytest.mark.parametrize("role", [*INSIDERS, "outsider"])
def test_job_list_and_dashboard_show_only_own_teams_jobs(client, cast, role):
    JobFactory(team=cast.team_a, name="team-a-job")
    JobFactory(team=cast.team_b, name="team-b-job")
    client.force_login(getattr(cast, role))

    for url in (reverse("job-list"), reverse("dashboard")):
        html = client.get(url).content.decode()
        assert ("team-a-job" in html) == (role != "outsider")
        assert ("team-b-job" in html) == (role == "outsider")


def test_asking_the_list_for_another_team_shows_ones_own(client, cast):
    JobFactory(team=cast.team_b, name="team-b-job")
    client.force_login(cast.member)

    html = client.get(reverse("job-list") + "?team=team-b").content.decode()

    assert "team-b-job" not in html


@pytest.mark.parametrize("role", INSIDERS)
def test_team_roles_may_open_the_submission_form(client, cast, role):
    client.force_login(getattr(cast, role))

    assert client.get(reverse("job-new")).status_code == 200


def test_the_portal_needs_a_login(client, job):
    for url in (reverse("job-list"), reverse("job-new"), reverse("job-detail", args=[job.id])):
        response = client.get(url)
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))


def test_every_member_sees_the_jobs_one_cost_and_an_outsider_nothing(client, cast, job):
    # One cost of a job on every surface (issue 29): the member API always gave members their
    # jobs' spend, so the page does too; the job itself stays the team's.
    pages = {}
    for user in (cast.finance, cast.member, cast.outsider):
        client.force_login(user)
        pages[user.username] = client.get(reverse("job-detail", args=[job.id]))

    assert "Cost (recorded)" in pages[cast.finance.username].content.decode()
    assert "Cost (recorded)" in pages[cast.member.username].content.decode()
    assert pages[cast.outsider.username].status_code == 404
