"""A rented machine's record says where it is: the offer's geolocation (and host, GPU count)
reaches the Machine row the admin lists, rented against the sandbox over HTTP."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts.models import Machine
from hosts.vast import VastClient
from jobs import lifecycle
from jobs.rent_decision import RentDecision
from jobs.renting import rent
from tests.support.factories import JobFactory, UserFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db


def test_a_rented_machine_records_the_geolocation_of_its_offer(sandbox, client):
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as vast:
        offers = {o.id: o for o in vast.search_offers({}, limit=1000)}  # before one is rented
        assert rent.rent(attempt.pk, now=now, client=vast) == "rented"
    attempt.refresh_from_db()

    offer = offers[attempt.offer_id]
    machine = Machine.objects.get(machine_id=attempt.machine_id)
    assert offer.geolocation  # the shipped market's offers say where they are
    assert machine.geolocation == offer.geolocation
    assert (machine.host_id, machine.num_gpus) == (offer.host_id, offer.num_gpus)
    assert machine.rentals == 1
    client.force_login(UserFactory(username="root", is_superuser=True, is_staff=True))
    listing = client.get(reverse("admin:hosts_machine_changelist")).content.decode()
    assert f'<td class="field-geolocation">{offer.geolocation}</td>' in listing


def test_the_offer_rented_is_found_among_the_candidates_not_only_the_first_choice():
    decision = {
        "chosen": {"offer": {"id": 1, "geolocation": "Texas, US"}},
        "candidates": [
            {"offer": {"id": 1, "geolocation": "Texas, US"}},
            {"offer": {"id": 2, "geolocation": "Quebec, CA"}},
        ],
    }

    assert RentDecision(decision).offer_summary(2)["geolocation"] == "Quebec, CA"
    assert RentDecision(decision).offer_summary(3) == {}
    assert RentDecision({"adopted": True}).offer_summary(1) == {}
    assert RentDecision({}).offer_summary(None) == {}
