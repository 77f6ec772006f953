"""A team's secrets in the admin and on the portal's Team page: set by name, sealed at rest,
write-only (a value is never rendered back, not even masked or after a form error), scoped to
the team's admins (another team's secret is 404, a member gets 403)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from nomadgpu.models import TeamSecret
from tests.support.factories import TeamSecretFactory

pytestmark = pytest.mark.django_db

HF_TOKEN = "hf_live_0123456789abcdefSECRET"
NEW_TOKEN = "hf_live_fedcba9876543210ROTATED"
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\nBG5vbmUAAAA\n-----END OPENSSH PRIVATE KEY-----\n"  # noqa: E501


def stored_value(secret: TeamSecret) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM nomadgpu_teamsecret WHERE id = %s", [secret.pk])
        return cursor.fetchone()[0]


def the_secret(team, name: str) -> TeamSecret:
    return TeamSecret.objects.get(team=team, name=name)


# ---- admin ------------------------------------------------------------------------------------


def admin_add(client, team, **fields):
    return client.post(
        reverse("admin:nomadgpu_teamsecret_add"), {"team": team.pk, "name": "HF_TOKEN", **fields}
    )


def admin_change(client, secret, **fields):
    url = reverse("admin:nomadgpu_teamsecret_change", args=[secret.pk])
    return client.post(url, {"team": secret.team_id, "name": secret.name, **fields})


def test_a_team_admin_adds_a_secret_in_the_admin_sealed_and_never_shown(client, cast):
    client.force_login(cast.admin)

    response = admin_add(client, cast.team_a, value=HF_TOKEN)

    assert response.status_code == 302, response.content.decode()[-3000:]
    secret = the_secret(cast.team_a, "HF_TOKEN")
    assert secret.value == HF_TOKEN
    assert HF_TOKEN not in stored_value(secret)
    change = client.get(reverse("admin:nomadgpu_teamsecret_change", args=[secret.pk]))
    listing = client.get(reverse("admin:nomadgpu_teamsecret_changelist"))
    for page in (change, listing):
        html = page.content.decode()
        assert page.status_code == 200
        assert HF_TOKEN not in html
        assert HF_TOKEN[-4:] not in html  # not even masked to its last characters
    assert 'type="password"' in change.content.decode()
    assert "HF_TOKEN" in listing.content.decode()
    assert "field-updated_at" in listing.content.decode()


def test_saving_a_secret_blank_in_the_admin_keeps_its_value_and_a_new_one_replaces_it(client, cast):
    secret = TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    client.force_login(cast.admin)

    assert admin_change(client, secret, value="", value_lines="").status_code == 302
    assert the_secret(cast.team_a, "HF_TOKEN").value == HF_TOKEN

    assert admin_change(client, secret, value=NEW_TOKEN).status_code == 302
    assert the_secret(cast.team_a, "HF_TOKEN").value == NEW_TOKEN


def test_a_deploy_key_keeps_its_line_breaks_through_the_multi_line_field(client, cast):
    client.force_login(cast.admin)

    admin_add(client, cast.team_a, name="DEPLOY_KEY", value_lines=PEM)

    assert the_secret(cast.team_a, "DEPLOY_KEY").value == PEM


def test_an_admin_form_with_an_error_does_not_echo_the_value_just_typed(client, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    client.force_login(cast.admin)

    response = admin_add(client, cast.team_a, value=NEW_TOKEN, value_lines=PEM)  # a duplicate

    assert response.status_code == 200  # refused, shown again
    html = response.content.decode()
    assert "already exists" in html
    assert NEW_TOKEN not in html
    assert "b3BlbnNzaC1rZXktdjEAAAA" not in html


def test_a_secret_needs_a_value_when_added(client, cast):
    client.force_login(cast.admin)

    response = admin_add(client, cast.team_a, value="")

    assert response.status_code == 200
    assert "A secret needs a value." in response.content.decode()
    assert not TeamSecret.objects.exists()


def test_a_team_admin_sees_only_their_teams_secrets_in_the_admin(client, cast):
    ours = TeamSecretFactory(team=cast.team_a, name="OURS_TOKEN", value=HF_TOKEN)
    theirs = TeamSecretFactory(team=cast.team_b, name="THEIR_TOKEN", value=NEW_TOKEN)
    client.force_login(cast.admin)

    listing = client.get(reverse("admin:nomadgpu_teamsecret_changelist")).content.decode()
    other = client.get(reverse("admin:nomadgpu_teamsecret_change", args=[theirs.pk]))
    steal = admin_change(client, theirs, value="overwritten")

    assert "OURS_TOKEN" in listing
    assert "THEIR_TOKEN" not in listing
    assert other.status_code == 404
    assert steal.status_code == 404
    assert the_secret(cast.team_b, "THEIR_TOKEN").value == NEW_TOKEN
    assert ours.pk != theirs.pk


def test_a_team_admin_cannot_add_a_secret_to_another_team(client, cast):
    client.force_login(cast.admin)

    response = admin_add(client, cast.team_b, value=HF_TOKEN)

    assert response.status_code == 200  # the team is not one of the choices
    assert not TeamSecret.objects.filter(team=cast.team_b).exists()


# ---- the portal's Team page --------------------------------------------------------------------


def team_page(client, team):
    return client.get(reverse("team-detail", args=[team.slug]))


def portal_set(client, team, **fields):
    return client.post(reverse("team-secret-set", args=[team.slug]), fields)


def test_a_team_admin_adds_replaces_and_deletes_a_secret_on_the_team_page(client, cast):
    client.force_login(cast.admin)

    added = portal_set(client, cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    page = team_page(client, cast.team_a).content.decode()
    assert added.status_code == 302
    assert the_secret(cast.team_a, "HF_TOKEN").value == HF_TOKEN
    assert 'data-secret="HF_TOKEN"' in page
    assert HF_TOKEN not in page
    assert HF_TOKEN[-4:] not in page

    portal_set(client, cast.team_a, name="HF_TOKEN", value=NEW_TOKEN)
    assert the_secret(cast.team_a, "HF_TOKEN").value == NEW_TOKEN
    assert TeamSecret.objects.filter(team=cast.team_a).count() == 1

    url = reverse("team-secret-delete", args=[cast.team_a.slug, "HF_TOKEN"])
    assert client.post(url).status_code == 302
    assert not TeamSecret.objects.filter(team=cast.team_a).exists()
    assert 'data-secret="HF_TOKEN"' not in team_page(client, cast.team_a).content.decode()


def test_a_bad_name_on_the_team_page_is_refused_without_echoing_the_value(client, cast):
    client.force_login(cast.admin)

    response = portal_set(client, cast.team_a, name="HF-TOKEN", value=HF_TOKEN, value_lines=PEM)

    html = response.content.decode()
    assert response.status_code == 400
    assert "letters, digits and _" in html
    assert HF_TOKEN not in html
    assert "b3BlbnNzaC1rZXktdjEAAAA" not in html
    assert not TeamSecret.objects.exists()


def test_only_the_teams_admins_see_or_change_its_secrets_on_the_team_page(client, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    delete_url = reverse("team-secret-delete", args=[cast.team_a.slug, "HF_TOKEN"])

    client.force_login(cast.member)
    member_page = team_page(client, cast.team_a).content.decode()
    member_set = portal_set(client, cast.team_a, name="HF_TOKEN", value="mine-now")
    member_delete = client.post(delete_url)
    client.force_login(cast.outsider)
    outsider_set = portal_set(client, cast.team_a, name="HF_TOKEN", value="mine-now")
    outsider_delete = client.post(delete_url)

    assert 'id="secrets"' not in member_page
    assert (member_set.status_code, member_delete.status_code) == (403, 403)
    assert (outsider_set.status_code, outsider_delete.status_code) == (404, 404)
    assert the_secret(cast.team_a, "HF_TOKEN").value == HF_TOKEN


def test_the_team_page_says_when_a_value_is_too_short_to_be_masked(client, cast):
    client.force_login(cast.admin)

    short = portal_set(client, cast.team_a, name="PIN", value="abc")
    page = team_page(client, cast.team_a).content.decode()
    portal_set(client, cast.team_a, name="TOKEN", value="abcd")
    quiet = team_page(client, cast.team_a).content.decode()

    assert short.status_code == 302
    assert "Secret PIN: the value is shorter than 4 characters: it is stored, but not" in page
    assert "shorter than 4 characters" not in quiet
