"""The job page's "Simulate host loss" (``portal.job_actions.job_drill``): a team admin confirms
and the running host is destroyed at the sandbox, through ``jobs.drill.destroy_running_host``;
members and finance neither see the button nor may post it, another team gets 404."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs import drill
from nomadgpu_cli import drill as cli_drill
from tests.support.factories import JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db

ASK = 16018470  # an RTX 4090 of the sandbox market
BUTTON = ">Simulate host loss</button>"


@pytest.fixture
def running(cast, sandbox, settings):
    """Team A's job training on a sandbox instance (nothing reported a step yet)."""
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = DEFAULT_KEY
    instance_id = sandbox.create(ASK, onstart="sleep 600")
    job = JobFactory(team=cast.team_a, name="drilled", state="running")
    make_attempt(job, state="running", instance_id=instance_id)
    return job


def drill_url(job) -> str:
    return reverse("job-drill", args=[job.pk])


def instance_of(job) -> int:
    return job.attempts.get().instance_id


def test_an_admin_confirms_and_the_host_is_destroyed_before_its_first_step(
    client, cast, running, sandbox
):
    client.force_login(cast.admin)

    asked = client.get(drill_url(running))
    not_yet = client.post(drill_url(running))  # no confirm: the page asks again
    done = client.post(drill_url(running), {"confirm": "yes"}, follow=True)

    assert "Yes, destroy the host" in asked.content.decode()
    assert "Yes, destroy the host" in not_yet.content.decode()
    instance = instance_of(running)
    assert sandbox.status(instance) in (None, "exited", "destroyed")
    drill = running.events.get(kind="drill")
    assert drill.message == (
        f"fire drill: instance {instance} destroyed by alice (portal) before its first step"
    )
    assert "None" not in drill.message
    html = done.content.decode()
    assert f"Fire drill: instance {instance} of attempt 1 destroyed before its first step." in html
    assert "fire drill: instance" in html  # on the timeline


def test_the_drill_names_the_last_heartbeats_step_once_there_is_one(client, cast, running):
    running.attempts.update(step=48)
    client.force_login(cast.admin)

    client.post(drill_url(running), {"confirm": "yes"})

    assert running.events.get(kind="drill").message.endswith(
        "destroyed by alice (portal) at step 48 (its last heartbeat)"
    )


def test_htmx_confirms_in_a_dialog_and_is_sent_back_to_the_job(client, cast, running):
    client.force_login(cast.admin)
    html = client.get(reverse("job-detail", args=[running.pk])).content.decode()

    response = client.post(drill_url(running), {"confirm": "yes"}, HTTP_HX_REQUEST="true")

    assert BUTTON in html
    assert f'hx-post="{drill_url(running)}" hx-confirm="Destroy the host of drilled now' in html
    assert f'<form method="post" action="{drill_url(running)}"' in html  # works without JS
    assert response["HX-Redirect"] == reverse("job-detail", args=[running.pk])
    assert running.events.filter(kind="drill").count() == 1


@pytest.mark.parametrize("role", ["member", "finance"])
def test_members_and_finance_see_no_button_and_may_not_drill(client, cast, running, sandbox, role):
    client.force_login(getattr(cast, role))

    html = client.get(reverse("job-detail", args=[running.pk])).content.decode()
    response = client.post(drill_url(running), {"confirm": "yes"})

    assert BUTTON not in html
    assert response.status_code == 403
    assert sandbox.status(instance_of(running)) is not None
    assert not running.events.filter(kind="drill").exists()


def test_another_team_gets_404(client, cast, running, sandbox):
    client.force_login(cast.outsider)

    assert client.get(drill_url(running)).status_code == 404
    assert client.post(drill_url(running), {"confirm": "yes"}).status_code == 404
    assert not running.events.filter(kind="drill").exists()


def test_a_job_without_a_running_host_has_no_button_and_no_drill(client, cast):
    job = JobFactory(team=cast.team_a, state="queued")
    client.force_login(cast.admin)

    html = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    response = client.post(drill_url(job), {"confirm": "yes"}, follow=True)

    assert BUTTON not in html
    assert f"No drill: job {job.pk} has no running host to destroy (state queued)." in (
        response.content.decode()
    )
    assert not job.events.filter(kind="drill").exists()


@pytest.mark.parametrize(
    ("step", "words"), [(None, " before its first step"), (48, " at step 48 (its last heartbeat)")]
)
def test_the_cli_and_the_server_say_where_the_host_had_got_to_alike(step, words):
    assert drill.step_words(step) == cli_drill.step_words(step) == words
