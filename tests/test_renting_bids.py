"""Interruptible rentals against the sandbox over HTTP: the bid the model chose is what Vast
is asked for and what the attempt records; an outbid job raises its bid and keeps its host, or
moves, as ``selection.outbid_choice`` decides (the choice itself is tested without a server in
tests/test_selection_rentals.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts import selection
from hosts.models import Machine
from hosts.vast import VastClient
from jobs import lifecycle
from jobs.models import Interruption, JobEvent
from jobs.renting import rent
from jobs.watchdog import instance_status, outbids, poll
from tests.support.factories import JobFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db


@pytest.fixture
def vast(sandbox, settings, monkeypatch):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)  # no worker here
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        yield client


def rented_bid(vast, **fields):
    job = JobFactory(
        total_steps=3000,
        requirements={**FIELD_REPORT_REQUIREMENTS, "rental": "interruptible"},
        **fields,
    )
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    assert rent.rent(attempt.pk, now=now, client=vast) == "rented"
    attempt.refresh_from_db()
    return attempt


def test_an_interruptible_job_is_rented_at_the_bid_the_model_chose(vast):
    attempt = rented_bid(vast)

    chosen = attempt.decision["rental"]
    instance = vast.show_instance(attempt.instance_id)
    assert instance.is_bid is True
    assert attempt.rental == selection.INTERRUPTIBLE
    assert attempt.bid_margin == chosen["rental"]["bid_margin"]
    assert attempt.dph_base == pytest.approx(chosen["gpu_usd_per_hour"])  # spend bills the bid
    assert chosen["rate_source"] == "prior"
    assert attempt.decision["alternatives"]  # on-demand and the other margins, for the page


def test_the_job_page_says_how_it_rented_with_what_rate_and_what_else_it_weighed(
    vast, client, cast
):
    attempt = rented_bid(vast, team=cast.team_a)
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()

    label = attempt.decision["rental"]["rental"]["label"]
    assert f"Rented <strong>{label}</strong>" in html
    assert "interruptions per hour expected (the prior: no history of this rental yet)" in html
    assert 'aria-label="Other ways to rent this offer"' in html
    others = attempt.decision["alternatives"]  # an interruptible job weighs the other margins
    assert others
    assert all(f"<td>{a['rental']['label']}</td>" in html for a in others)


def outbid(sandbox, vast, attempt):
    sandbox.inject(attempt.instance_id, "outbid")
    wait_until(
        lambda: instance_status.is_outbid(vast.show_instance(attempt.instance_id)),
        timeout=10,
        what="the sandbox to show the instance outbid",
    )


def test_an_outbid_job_that_raises_its_bid_keeps_its_host_and_is_no_interruption(
    sandbox, vast, monkeypatch
):
    attempt = rented_bid(vast)
    outbid(sandbox, vast, attempt)
    floor = vast.show_instance(attempt.instance_id).min_bid
    raise_to = round(floor * 1.2, 4)
    monkeypatch.setattr(
        outbids, "outbid_choice_for", lambda a, i, now: selection.OutbidChoice(raise_to, 1.0, 2.0)
    )

    assert poll.poll_providers(timezone.now()) == []

    attempt.refresh_from_db()
    assert attempt.state == "starting"  # the same attempt, its container restarting
    assert attempt.dph_base == raise_to
    raised = JobEvent.objects.get(job=attempt.job, kind="bid_raised")
    assert raised.data["bid_usd_per_hour"] == raise_to
    assert not Interruption.objects.exists()
    wait_until(
        lambda: vast.show_instance(attempt.instance_id).actual_status == "running",
        timeout=15,
        what="the raised bid to win the machine back",
    )


def test_an_outbid_job_that_moves_avoids_the_machine_but_does_not_blame_it(
    sandbox, vast, monkeypatch
):
    attempt = rented_bid(vast)
    outbid(sandbox, vast, attempt)
    monkeypatch.setattr(
        outbids, "outbid_choice_for", lambda a, i, now: selection.OutbidChoice(None, 2.0, 1.0)
    )
    now = timezone.now()

    [loss] = poll.poll_providers(now)
    assert loss.cause == "outbid"
    assert lifecycle.handle_loss(loss, now=now)

    attempt.refresh_from_db()
    attempt.job.refresh_from_db()
    assert attempt.state == "ended"
    assert attempt.job.state == "recovering"
    assert attempt.job.avoid_machine_ids == [attempt.machine_id]
    assert Machine.objects.get(machine_id=attempt.machine_id).interruptions == 0
    assert JobEvent.objects.filter(job=attempt.job, kind="outbid").exists()  # the choice, said
