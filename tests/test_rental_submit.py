"""What a job asks of its rental is checked at submit, before anything is rented: a bid cap
outside Vast's range, or ``interruptible`` when no matching offer takes a bid."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts.vast import VastClient
from jobs.job_templates import template_spec
from jobs.models import Job
from nomadgpu import api_tokens
from portal.forms import spec_to_initial

pytestmark = pytest.mark.django_db


def submit(client, user, **requirements):
    spec = template_spec("toy")
    spec["requirements"] = {**spec.get("requirements", {}), **requirements}
    _, token = api_tokens.create_token(user=user, name="t", now=timezone.now())
    return client.post(
        "/api/jobs/",
        {**spec, "team": "team-a"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


@pytest.mark.parametrize("bid", [0.0001, 500])
def test_a_bid_cap_outside_vasts_range_is_refused_and_nothing_is_created(client, cast, bid):
    response = submit(client, cast.member, rental="interruptible", max_bid_dph=bid)

    assert response.status_code == 422
    assert "max_bid_dph" in str(response.json()["detail"])
    assert Job.objects.count() == 0


def test_interruptible_with_no_offer_taking_such_a_bid_is_refused_before_any_rent(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"

    response = submit(client, cast.member, rental="interruptible", max_bid_dph=0.001)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "none of the" in detail
    assert "takes a bid at or under $0.001/h" in detail
    assert "rental auto or on-demand" in detail
    assert Job.objects.count() == 0
    with VastClient("sandbox-key", sandbox.url) as vast:
        assert vast.list_instances() == []


def test_interruptible_on_a_market_that_takes_bids_is_accepted(client, cast, sandbox, settings):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"

    response = submit(client, cast.member, rental="interruptible")

    assert response.status_code == 201, response.content
    assert Job.objects.get().requirements["rental"] == "interruptible"


def test_the_portal_form_says_the_same_under_the_rental_field(client, cast, sandbox, settings):
    client.force_login(cast.member)
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    form = {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"}
    form |= {"rental": "interruptible", "max_bid_dph": "0.001"}

    response = client.post(reverse("job-new"), form)

    html = response.content.decode()
    assert response.status_code == 200
    assert "takes a bid at or under $0.001/h" in html
    assert Job.objects.count() == 0
