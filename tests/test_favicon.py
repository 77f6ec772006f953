"""Every page names the favicon, and /favicon.ico (asked by pages that name none) reaches the
same static file: no 404 per page view."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.support.factories import TeamFactory

pytestmark = pytest.mark.django_db
ICON_LINK = '<link rel="icon" href="/static/nomadgpu/favicon.svg" type="image/svg+xml">'


@pytest.fixture
def static_client(settings):
    """A client whose WhiteNoise serves the checkout's static files, as under `make run`
    (a fresh client: WhiteNoise reads its settings when the middleware is built)."""
    settings.WHITENOISE_USE_FINDERS = True
    settings.WHITENOISE_AUTOREFRESH = True
    return Client()


def test_portal_status_admin_and_login_pages_name_the_icon(client, cast):
    TeamFactory(slug="open", name="Open", public_status_page=True)
    client.force_login(cast.admin)
    pages = [
        reverse("dashboard"),
        reverse("team-detail", args=[cast.team_a.slug]),
        "/status/open/",
        reverse("admin:index"),
    ]
    for url in pages:
        assert ICON_LINK in client.get(url).content.decode(), url
    client.logout()
    assert ICON_LINK in client.get(reverse("login")).content.decode()


def test_favicon_ico_is_the_static_icon(static_client):
    response = static_client.get("/favicon.ico", follow=True)

    assert response.redirect_chain == [("/static/nomadgpu/favicon.ico", 301)]
    assert response.status_code == 200
    assert b"".join(response.streaming_content)[:4] == b"\x00\x00\x01\x00"  # an ICO file


def test_the_linked_svg_icon_is_served(static_client):
    response = static_client.get("/static/nomadgpu/favicon.svg")

    assert response.status_code == 200
    assert b"<svg" in b"".join(response.streaming_content)
