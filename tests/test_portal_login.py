from __future__ import annotations

import re

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


def test_demo_bootstrap_creates_one_user_per_role_once_and_their_passwords_once():
    from nomadgpu.services import ensure_demo_team

    team, users = ensure_demo_team()
    again, second = ensure_demo_team()

    assert team == again
    assert {(u.username, u.role) for u in users} == {
        ("admin", "admin"),
        ("member", "member"),
        ("finance", "finance"),
    }
    assert all(u.password for u in users)
    assert not any(u.password for u in second)
    roles = dict(team.memberships.values_list("user__username", "role"))
    assert roles == {"admin": "admin", "member": "member", "finance": "finance"}


def test_bootstrap_demo_prints_every_roles_password_together(client):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("bootstrap_demo", stdout=out)
    printed = out.getvalue()
    passwords = dict(re.findall(r"^\s+(\w+)\s.*password: (\S+)$", printed, re.M))

    assert set(passwords) == {"admin", "member", "finance"}
    for username, password in passwords.items():
        assert client.login(username=username, password=password), username
    out = StringIO()
    call_command("bootstrap_demo", stdout=out)
    assert "already exist" in out.getvalue()
    assert "password:" not in out.getvalue()
