"""A member of team A never sees team B's objects: 404 in the portal and in the admin."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nomadgpu.permissions import can_manage_team, can_see_billing, visible_to
from tests.support.factories import ChannelFactory, JobFactory

pytestmark = pytest.mark.django_db


def test_portal_job_page_of_another_team_is_404(client, cast):
    theirs = JobFactory(team=cast.team_b)
    client.force_login(cast.member)

    response = client.get(reverse("job-detail", args=[theirs.id]))

    assert response.status_code == 404


def test_portal_job_page_of_own_team_is_shown(client, cast):
    mine = JobFactory(team=cast.team_a, name="llama-sft")
    client.force_login(cast.member)

    response = client.get(reverse("job-detail", args=[mine.id]))

    assert response.status_code == 200
    assert b"llama-sft" in response.content


def test_portal_team_page_of_another_team_is_404(client, cast):
    client.force_login(cast.member)

    assert client.get(reverse("team-detail", args=["team-b"])).status_code == 404
    assert client.get(reverse("team-detail", args=["team-a"])).status_code == 200


def test_dashboard_lists_only_own_teams_jobs(client, cast):
    JobFactory(team=cast.team_a, name="ours-7b")
    JobFactory(team=cast.team_b, name="theirs-70b")
    client.force_login(cast.member)

    body = client.get(reverse("dashboard")).content.decode()

    assert "ours-7b" in body
    assert "theirs-70b" not in body


def test_admin_change_page_of_another_teams_job_is_404(client, cast):
    theirs = JobFactory(team=cast.team_b)
    client.force_login(cast.admin)

    response = client.get(reverse("admin:jobs_job_change", args=[theirs.id]))

    assert response.status_code == 404


def test_admin_change_page_of_another_team_is_404(client, cast):
    client.force_login(cast.admin)

    response = client.get(reverse("admin:nomadgpu_team_change", args=[cast.team_b.id]))

    assert response.status_code == 404


def test_admin_lists_only_own_teams_jobs(client, cast):
    JobFactory(team=cast.team_a, name="ours-7b")
    JobFactory(team=cast.team_b, name="theirs-70b")
    client.force_login(cast.admin)

    body = client.get(reverse("admin:jobs_job_changelist")).content.decode()

    assert "ours-7b" in body
    assert "theirs-70b" not in body


def test_a_plain_member_has_no_admin(client, cast):
    client.force_login(cast.member)

    response = client.get(reverse("admin:jobs_job_changelist"))

    assert response.status_code == 302  # to the admin login: members are not staff
    assert cast.member.is_staff is False


def test_team_admin_role_grants_admin_and_losing_it_revokes(cast):
    assert cast.admin.is_staff is True

    cast.admin.memberships.update(role="member")  # bulk update skips signals: use the model
    membership = cast.admin.memberships.get()
    membership.save()
    cast.admin.refresh_from_db()

    assert cast.admin.is_staff is False


def test_roles_decide_billing_and_management(cast):
    assert can_see_billing(cast.finance, cast.team_a)
    assert can_see_billing(cast.admin, cast.team_a)
    assert not can_see_billing(cast.member, cast.team_a)
    assert not can_see_billing(cast.outsider, cast.team_a)
    assert can_manage_team(cast.admin, cast.team_a)
    assert not can_manage_team(cast.finance, cast.team_a)
    assert not can_manage_team(cast.outsider, cast.team_a)


def test_visible_to_narrows_any_queryset_to_member_teams(cast):
    from jobs.models import Job

    ours = JobFactory(team=cast.team_a)
    JobFactory(team=cast.team_b)

    assert list(visible_to(Job.objects.all(), cast.member)) == [ours]


def test_admin_cancel_action_cancels_a_running_job(client, cast, monkeypatch):
    from tests.support.factories import make_attempt

    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    attempt, _ = make_attempt(JobFactory(team=cast.team_a), state="running", instance_id=5)
    client.force_login(cast.admin)

    client.post(
        reverse("admin:jobs_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [attempt.job_id]},
    )

    attempt.refresh_from_db()
    attempt.job.refresh_from_db()
    assert attempt.job.state == "cancelled"
    assert attempt.state == "ended"


def test_every_model_has_an_admin_page(client, cast):
    from django.apps import apps
    from django.contrib import admin as django_admin

    ours = [m for m in apps.get_models() if m._meta.app_label in {"nomadgpu", "jobs", "hosts"}]

    assert all(model in django_admin.site._registry for model in ours)


def test_team_page_lists_its_notification_channels(client, cast):
    ChannelFactory(team=cast.team_a, kind="webhook", name="ops-hook", webhook_url="https://x.test")
    ChannelFactory(
        team=cast.team_b, kind="webhook", name="their-hook", webhook_url="https://y.test"
    )
    client.force_login(cast.member)

    body = client.get(reverse("team-detail", args=["team-a"])).content.decode()

    assert "ops-hook" in body
    assert "their-hook" not in body
