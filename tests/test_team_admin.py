"""Adding a team's people in the admin: members inline, "add member" with a one-time
set-password link (also on the portal's team page for the team's admins), and ``created_at``
read-only on every admin page."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin as django_admin
from django.contrib.auth import get_user_model
from django.test import RequestFactory
from django.urls import reverse

from nomadgpu.models import Membership, Role
from tests.support.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "a-long-enough-Passw0rd"


def add_member_url(team) -> str:
    return reverse("admin:nomadgpu_team_add_member", args=[team.pk])


def add_member(client, team, **fields):
    return client.post(add_member_url(team), {"role": Role.MEMBER, **fields})


def shown_link(page: str) -> str:
    found = re.search(r'id="set-password-link" href="([^"]+)"', page)
    assert found, page[-3000:]
    return found.group(1)


def test_the_team_page_in_the_admin_has_its_members_inline_by_user_and_role(client, cast):
    client.force_login(cast.admin)

    page = client.get(reverse("admin:nomadgpu_team_change", args=[cast.team_a.pk]))
    html = page.content.decode()

    assert page.status_code == 200
    assert 'name="memberships-0-user"' in html
    assert 'name="memberships-0-role"' in html
    assert 'name="memberships-0-created_at"' not in html
    assert add_member_url(cast.team_a) in html  # the "Add member" button


def test_adding_a_member_creates_the_user_and_shows_a_link_that_sets_the_password_once(
    client, cast
):
    client.force_login(cast.admin)

    page = add_member(client, cast.team_a, username="nina", email="nina@example.com")
    link = shown_link(page.content.decode())

    nina = get_user_model().objects.get(username="nina")
    assert not nina.has_usable_password()
    assert Membership.objects.get(user=nina).role == Role.MEMBER
    assert Membership.objects.get(user=nina).team == cast.team_a
    client.logout()
    form = client.get(link, follow=True)
    assert "Set your password" in form.content.decode()
    assert 'name="new_password1"' in form.content.decode()
    set_url = form.redirect_chain[-1][0]
    done = client.post(
        set_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}, follow=True
    )
    assert done.redirect_chain[-1][0] == reverse("dashboard")
    assert done.wsgi_request.user.username == "nina"  # signed in
    client.logout()
    assert client.login(username="nina", password=NEW_PASSWORD)
    client.logout()
    again = client.get(link, follow=True).content.decode()
    assert "already been used or has expired" in again
    assert 'name="new_password1"' not in again


def test_a_member_can_be_added_as_finance(client, cast):
    client.force_login(cast.admin)

    add_member(client, cast.team_a, username="flo", role=Role.FINANCE)

    assert Membership.objects.get(user__username="flo").role == Role.FINANCE


def test_a_taken_username_is_refused_under_its_field_and_nothing_is_created(client, cast):
    client.force_login(cast.admin)

    page = add_member(client, cast.team_a, username="OLGA")  # the outsider, case aside

    assert page.status_code == 200
    assert "already exists" in page.content.decode()
    assert not Membership.objects.filter(team=cast.team_a, user=cast.outsider).exists()
    assert get_user_model().objects.filter(username__iexact="olga").count() == 1


def test_another_teams_admin_cannot_add_members_to_it(client, cast):
    client.force_login(cast.outsider)

    assert client.get(add_member_url(cast.team_a)).status_code == 404
    assert add_member(client, cast.team_a, username="sneaky").status_code == 404
    assert not get_user_model().objects.filter(username="sneaky").exists()


def test_a_plain_member_has_no_add_member_page(client, cast):
    client.force_login(cast.member)

    response = client.get(add_member_url(cast.team_a))

    assert response.status_code == 302  # to the admin login: members are not staff


def test_the_portal_team_page_shows_the_link_to_the_teams_admins_only(client, cast):
    client.force_login(cast.admin)
    add_member(client, cast.team_a, username="nina")
    team_page = reverse("team-detail", args=[cast.team_a.slug])

    as_admin = client.get(team_page).content.decode()
    client.force_login(cast.member)
    as_member = client.get(team_page).content.decode()

    links = re.findall(r'class="set-password-link" href="([^"]+)"', as_admin)
    assert len(links) == 1  # nina only: the cast have passwords
    assert "/account/set-password/" in links[0]
    client.logout()
    assert 'name="new_password1"' in client.get(links[0], follow=True).content.decode()
    assert "nina" in as_member
    assert "set-password-link" not in as_member


def test_a_team_admin_picks_members_only_among_the_people_of_their_teams(client, cast):
    stranger = UserFactory(username="stranger")
    client.force_login(cast.admin)

    page = client.get(reverse("admin:nomadgpu_team_change", args=[cast.team_a.pk]))
    html = page.content.decode()

    assert ">bob<" in html
    assert ">olga<" not in html  # another team's admin
    assert f">{stranger.username}<" not in html


def superuser_request():
    request = RequestFactory().get("/admin/")
    request.user = UserFactory(username="root", is_superuser=True, is_staff=True)
    return request


def editable_fields(model_admin, request) -> set[str]:
    """The fields a person could type into on MODEL_ADMIN's pages and its inlines."""
    found = set()
    if model_admin.has_add_permission(request) or model_admin.has_change_permission(request):
        found |= set(model_admin.get_form(request).base_fields)
    for inline in model_admin.get_inline_instances(request):
        found |= set(inline.get_formset(request).form.base_fields)
    return found


def test_created_at_is_read_only_on_every_admin_page_and_inline():
    request = superuser_request()

    editable = {
        model._meta.label: editable_fields(model_admin, request)
        for model, model_admin in django_admin.site._registry.items()
    }

    assert not [label for label, fields in editable.items() if "created_at" in fields]
    assert "role" in editable["nomadgpu.Membership"]  # the check sees real forms


def test_the_membership_page_shows_created_at_without_an_input(client, cast):
    membership = MembershipFactory(team=cast.team_a, user__username="newbie")
    client.force_login(cast.admin)

    html = client.get(
        reverse("admin:nomadgpu_membership_change", args=[membership.pk])
    ).content.decode()

    assert 'name="role"' in html
    assert 'name="created_at' not in html
    assert "Created at" in html
