from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_login_page_renders(client):
    response = client.get(reverse("login"))

    assert response.status_code == 200
    assert b"Sign in to NomadGPU" in response.content


def test_anonymous_visitor_is_sent_to_login(client):
    response = client.get(reverse("dashboard"))

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_signing_in_lands_on_the_dashboard(client, cast):
    response = client.post(
        reverse("login"), {"username": "bob", "password": "pw-for-tests-only"}, follow=True
    )

    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == reverse("dashboard")
    assert b"Team A" in response.content


def test_health_endpoint_answers(client):
    response = client.get("/api/health")

    assert response.json() == {"ok": True, "database": True}


def test_demo_bootstrap_creates_once_and_prints_password_once():
    from nomadgpu.services import ensure_demo_team

    team, password = ensure_demo_team()
    again, second = ensure_demo_team()

    assert team == again
    assert password
    assert second is None
