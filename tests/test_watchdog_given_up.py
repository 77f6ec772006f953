"""Contracts Vast gives up before the container runs, against the sandbox over HTTP: a host that
cannot start the container is a start failure at once (avoided, counted against the machine,
never bid for again), and a bid outbid while its image loads is outbid (raise or move, as
``selection.outbid_choice`` decides). The rules on recorded bodies, without a server, are in
tests/test_watchdog_rules.py."""

from __future__ import annotations

import pytest
from django.utils import timezone

from hosts import selection
from hosts.models import Machine
from hosts.vast import VastClient
from jobs import lifecycle
from jobs.models import Interruption, JobEvent
from jobs.renting import rent
from jobs.watchdog import outbids, poll
from tests.support.factories import JobFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db

INTERRUPTIBLE = {**FIELD_REPORT_REQUIREMENTS, "rental": "interruptible"}


def rented(box, settings, requirements):
    """A job rented on BOX, its attempt starting (the agent never registers here)."""
    settings.VAST_URL, settings.VAST_API_KEY = box.url, DEFAULT_KEY
    job = JobFactory(total_steps=3000, requirements=requirements)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, box.url) as client:
        assert rent.rent(attempt.pk, now=now, client=client) == "rented"
    attempt.refresh_from_db()
    return attempt


def given_up(box, attempt) -> None:
    """Wait until the sandbox shows ATTEMPT's contract given up (all three states stopped)."""

    def states() -> tuple:
        shown = client.show_instance(attempt.instance_id)
        return (shown.cur_state, shown.intended_status, shown.next_state)

    with VastClient(DEFAULT_KEY, box.url) as client:
        wait_until(
            lambda: states() == ("stopped",) * 3,
            timeout=10,
            what="the sandbox to show the contract given up",
        )


@pytest.fixture
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


@pytest.mark.usefixtures("no_worker")
def test_a_host_that_cannot_start_the_container_is_lost_at_once_and_blamed(sandbox, settings):
    attempt = rented(sandbox, settings, FIELD_REPORT_REQUIREMENTS)
    sandbox.inject(attempt.instance_id, "oci-fail")
    given_up(sandbox, attempt)
    now = timezone.now()  # long before the start timeout: nothing waits for it

    [loss] = poll.poll_providers(now)
    assert (loss.attempt_id, loss.cause) == (attempt.pk, "start_failed")
    assert "OCI runtime create failed" in loss.detail
    assert lifecycle.handle_loss(loss, now=now)

    attempt.refresh_from_db()
    attempt.job.refresh_from_db()
    assert attempt.state == "ended"
    assert attempt.job.state == "recovering"
    assert attempt.job.avoid_machine_ids == [attempt.machine_id]
    assert Machine.objects.get(machine_id=attempt.machine_id).interruptions == 1
    assert Interruption.objects.get(attempt=attempt).cause == "start_failed"


@pytest.mark.usefixtures("no_worker")
def test_a_bid_on_a_host_that_cannot_start_the_container_is_never_raised(
    sandbox, settings, monkeypatch
):
    attempt = rented(sandbox, settings, INTERRUPTIBLE)
    assert attempt.rental == selection.INTERRUPTIBLE
    raise_to = round(attempt.dph_base * 1.5, 4)  # the model would pay to keep an outbid host
    monkeypatch.setattr(
        outbids, "outbid_choice_for", lambda a, i, now: selection.OutbidChoice(raise_to, 1.0, 2.0)
    )
    sandbox.inject(attempt.instance_id, "oci-fail")
    given_up(sandbox, attempt)

    [loss] = poll.poll_providers(timezone.now())

    assert loss.cause == "start_failed"
    assert not JobEvent.objects.filter(job=attempt.job, kind="bid_raised").exists()
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        assert client.show_instance(attempt.instance_id).dph_base == attempt.dph_base


@pytest.mark.usefixtures("no_worker")
def test_a_bid_outbid_while_its_image_loads_is_outbid_and_moves_without_blame(
    sandbox_factory, settings, monkeypatch
):
    # A tenth of real time, no other tenants, a fixed min_bid: the image loads for seconds.
    # A fixed 3 s of scheduling: the drawn minutes of Vast's would outlast the wait for loading.
    timing = ("--time-scale", "0.1", "--scheduling-s", "3")
    box = sandbox_factory(
        *timing, "--outbid-rate-per-h", "0", "--min-bid-step-pct", "0", fast=False
    )
    attempt = rented(box, settings, INTERRUPTIBLE)
    box.wait_status(attempt.instance_id, "loading", timeout=15)
    box.inject(attempt.instance_id, "outbid")
    given_up(box, attempt)
    monkeypatch.setattr(
        outbids, "outbid_choice_for", lambda a, i, now: selection.OutbidChoice(None, 2.0, 1.0)
    )
    now = timezone.now()

    [loss] = poll.poll_providers(now)
    assert loss.cause == "outbid"
    assert box.status(attempt.instance_id) == "loading"  # the shape Vast showed it in
    assert lifecycle.handle_loss(loss, now=now)

    attempt.job.refresh_from_db()
    assert attempt.job.avoid_machine_ids == [attempt.machine_id]  # avoided, not blamed
    assert Machine.objects.get(machine_id=attempt.machine_id).interruptions == 0
