"""The new-job preview prices a machine the team pulled the job's image on as likely to hold
it, and tags its row "image cached", on the shipped market through the sandbox over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from jobs.job_templates import template_spec
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}
T0 = datetime(2026, 11, 4, 12, 0, tzinfo=UTC)


def preview(client):
    spec = template_spec("toy")
    data = {**spec_to_initial(spec), "team": "team-a", "rental": "on-demand"}
    form = {**data, "verified_only": "on", "action": "preview"}
    return client.post(reverse("job-new"), form, **HX)


def test_the_machine_that_pulled_the_image_before_is_tagged_and_priced_lower(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    client.force_login(cast.member)
    before = {row.machine_id: row for row in preview(client).context["preview"].rows}
    machine = list(before)[1]  # the runner-up's machine ran a job of the team with this image
    rented = T0
    make_attempt(
        JobFactory(team=cast.team_a, image=template_spec("toy")["image"]),
        state="ended",
        machine_id=machine,
        rented_at=rented,
        container_started_at=rented + timedelta(seconds=60),
    )

    response = preview(client)
    after = {row.machine_id: row for row in response.context["preview"].rows}

    assert after[machine].image_cached_chance == pytest.approx(0.8)  # the prior: no later rental
    assert after[machine].total_usd < before[machine].total_usd
    assert [m for m, row in after.items() if row.image_cached_text] == [machine]
    html = response.content.decode()
    assert html.count("image cached (80 %)") == 1
    assert 'No row says "model on disk"' in html
