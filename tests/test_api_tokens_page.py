"""The portal's API tokens page: a token is shown once, stored hashed, and revocable."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from nomadgpu.models import ApiToken
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

URL = "/account/tokens/"


def test_it_needs_a_login(client):
    response = client.get(URL)

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_created_token_is_shown_once_and_works_for_the_api(client, cast):
    client.force_login(cast.member)

    created = client.post(URL, {"name": "laptop"}).content.decode()
    token = re.search(r'<code id="new-token">(ngpt_[\w-]+)</code>', created)[1]
    later = client.get(URL).content.decode()
    client.logout()
    api = client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert token not in later
    assert "laptop" in later
    assert f"ngpt_{ApiToken.objects.get().prefix}…" in later
    assert not ApiToken.objects.filter(digest__contains=token[5:]).exists()
    assert api.status_code == 200


def test_a_token_needs_a_name(client, cast):
    client.force_login(cast.member)

    response = client.post(URL, {"name": ""})

    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_revoking_stops_the_token(client, cast):
    client.force_login(cast.member)
    token = re.search(r"(ngpt_[\w-]{20,})", client.post(URL, {"name": "ci"}).content.decode())[1]
    row = ApiToken.objects.get()

    response = client.post(reverse("account-token-revoke", args=[row.pk]), follow=True)
    client.logout()

    assert "revoked" in response.content.decode()
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401


def test_another_users_token_cannot_be_seen_or_revoked(client, cast):
    client.force_login(cast.outsider)
    client.post(URL, {"name": "olga-laptop"})
    row = ApiToken.objects.get()
    client.force_login(cast.member)

    page = client.get(URL).content.decode()
    response = client.post(reverse("account-token-revoke", args=[row.pk]))

    assert "olga-laptop" not in page
    assert response.status_code == 404
    row.refresh_from_db()
    assert row.revoked_at is None


def test_the_navigation_links_to_the_page(client, cast):
    client.force_login(cast.member)

    assert f'href="{URL}"' in client.get(reverse("dashboard")).content.decode()


def test_the_admin_lists_tokens_masked_for_superusers(client, cast):
    client.force_login(cast.member)
    client.post(URL, {"name": "laptop"})
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)

    page = client.get(reverse("admin:nomadgpu_apitoken_changelist")).content.decode()

    assert "laptop" in page
    assert f"ngpt_{ApiToken.objects.get().prefix}…" in page
