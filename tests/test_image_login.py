"""A private image's registry login goes to Vast as the create's ``image_login`` and nowhere
else, and no other secret goes to Vast at all: checked against the sandbox over HTTP, whose
record of the create request (its state, its instance listings, its own debug view) must hold
no secret value, as Vast's instance object shows ``env``, ``onstart`` and ``label`` but no
``image_login`` (sandbox/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone

from hosts.vast import VastClient
from jobs import lifecycle
from jobs.renting import rent as renting
from tests.support.factories import JobFactory, TeamSecretFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.sandbox import DEFAULT_KEY, market_offers

pytestmark = pytest.mark.django_db

REGISTRY_TOKEN = "ghp_registryTOKEN0123456789"
IMAGE_LOGIN = f"-u nomad-bot -p {REGISTRY_TOKEN} ghcr.io"
HF_TOKEN = "hf_live_0123456789abcdefSECRET"


def recorded_text(sandbox) -> str:
    """Everything the sandbox keeps on disk (its database, instance folders, its log)."""
    paths = [p for p in Path(sandbox.state_dir).rglob("*") if p.is_file()]
    paths.append(sandbox.log_path)
    return "\n".join(p.read_bytes().decode("latin-1") for p in paths if p.exists())


def shown_by_the_api(sandbox, instance_id: int) -> str:
    client = sandbox.client()
    one = client.get(f"/api/v0/instances/{instance_id}/").json()
    listing = client.get("/api/v1/instances/").json()
    return json.dumps([one, listing])


def an_ask() -> int:
    return next(iter(market_offers()))


def test_the_sandbox_takes_image_login_and_never_shows_or_keeps_its_token(sandbox):
    iid = sandbox.create(an_ask(), image="ghcr.io/acme/trainer:1", image_login=IMAGE_LOGIN)

    shown = shown_by_the_api(sandbox, iid)

    assert sandbox.debug(iid)["image_login"] == {"registry": "ghcr.io", "user": "nomad-bot"}
    assert "image_login" not in shown
    assert REGISTRY_TOKEN not in shown
    assert REGISTRY_TOKEN not in json.dumps(sandbox.debug(iid))
    assert REGISTRY_TOKEN not in recorded_text(sandbox)


def test_the_sandbox_refuses_an_image_login_that_is_not_a_string(sandbox):
    reply = sandbox.client().put(
        f"/api/v0/asks/{an_ask()}/", json={"image": "ubuntu:22.04", "image_login": ["-u", "x"]}
    )

    assert reply.status_code == 400
    assert reply.json()["error"] == "invalid_args"


@pytest.fixture
def vast(sandbox, settings, monkeypatch):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)  # no worker here
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        yield client


def rent(vast, job):
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    assert renting.rent(attempt.pk, now=now, client=vast) == "rented"
    attempt.refresh_from_db()
    return attempt


def test_a_job_with_a_registry_login_and_secrets_rents_with_only_the_login(sandbox, vast, cast):
    TeamSecretFactory(team=cast.team_a, name="GHCR_LOGIN", value=IMAGE_LOGIN)
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    job = JobFactory(
        team=cast.team_a,
        image="ghcr.io/acme/trainer:1",
        secrets=["HF_TOKEN"],
        image_login_secret="GHCR_LOGIN",
        setup="pip install -r requirements.txt",
        requirements=FIELD_REPORT_REQUIREMENTS,
    )

    attempt = rent(vast, job)

    debug = sandbox.debug(attempt.instance_id)
    assert debug["image_login"] == {"registry": "ghcr.io", "user": "nomad-bot"}  # it arrived
    for where in (recorded_text(sandbox), shown_by_the_api(sandbox, attempt.instance_id)):
        assert HF_TOKEN not in where  # not in env, onstart or label
        assert REGISTRY_TOKEN not in where
    assert "HF_TOKEN" not in shown_by_the_api(sandbox, attempt.instance_id)


def test_a_job_without_a_registry_login_sends_none(sandbox, vast, cast):
    job = JobFactory(team=cast.team_a, requirements=FIELD_REPORT_REQUIREMENTS)

    attempt = rent(vast, job)

    assert sandbox.debug(attempt.instance_id)["image_login"] is None
