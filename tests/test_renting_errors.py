"""Renting never leaves an attempt stuck ``requested``: an unexpected error closes it at once and
the job is rented again at its next turn (against the sandbox over HTTP)."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.build import build_zipapp
from hosts.vast import VastClient
from jobs import lifecycle
from jobs.models import AttemptState, JobEvent, label_for
from jobs.renting import rent as renting
from tests.support.factories import JobFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.sandbox import DEFAULT_KEY


@pytest.mark.django_db
def test_an_error_while_renting_closes_the_attempt_at_once_and_the_job_is_rented_next_turn(
    sandbox, settings, monkeypatch
):
    settings.RENT_BACKOFF_START_S = 15
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()

    def broken_build(*args, **kwargs):
        raise FileNotFoundError("agent-0123.pyz.tmp")

    with monkeypatch.context() as patch:
        patch.setattr(renting, "render_bootstrap", broken_build)
        attempt = lifecycle.plan_rent(job.pk, now=now)
        with VastClient(DEFAULT_KEY, sandbox.url) as client:
            assert renting.rent(attempt.pk, now=now, client=client) == "no-offers"
            assert client.list_instances() == []  # nothing was created, so nothing bills

    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.state, attempt.end_reason) == (AttemptState.ENDED, "rent_error")
    assert job.next_rent_at == now + timedelta(seconds=15)
    said = JobEvent.objects.get(job=job, kind="no_offers").message
    assert "FileNotFoundError" in said

    later = now + timedelta(seconds=15)
    retry = lifecycle.plan_rent(job.pk, now=later)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        assert renting.rent(retry.pk, now=later, client=client) == "rented"
    assert retry.number == 2


@pytest.mark.django_db
def test_an_account_without_credit_stops_renting_and_tells_the_admin_to_top_up(sandbox_factory):
    broke = sandbox_factory("--credit", "0")
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    creates = []
    with VastClient(DEFAULT_KEY, broke.url) as client:
        real = client.create_instance

        def counted(*args, **kwargs):
            creates.append(args[0])
            return real(*args, **kwargs)

        client.create_instance = counted
        assert renting.rent(attempt.pk, now=now, client=client) == "no-offers"
        assert client.list_instances() == []

    attempt.refresh_from_db()
    assert (attempt.state, attempt.end_reason) == (AttemptState.ENDED, "no_credit")
    assert len(creates) == 1  # every offer would say the same: not tried one by one
    said = JobEvent.objects.get(job=job, kind="no_offers").message
    assert "billing" in said
    assert "a team admin must add credit to the Vast account" in said


@pytest.mark.django_db
def test_a_contract_created_stopped_is_destroyed_at_once_and_the_reason_kept(sandbox):
    # A bid under min_bid: Vast creates the instance stopped and answers success: false.
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        real = client.create_instance

        def underbid(offer_id, **kwargs):
            return real(offer_id, **{**kwargs, "bid_usd_per_hour": 0.001})

        client.create_instance = underbid
        assert renting.rent(attempt.pk, now=now, client=client) == "no-offers"
        assert client.list_instances() == []  # every stopped contract destroyed: nothing bills

    attempt.refresh_from_db()
    assert attempt.instance_id is None
    said = JobEvent.objects.get(job=job, kind="no_offers").message
    assert "was created stopped (bid under min_bid)" in said


def test_the_bootstrap_fits_vasts_create_limits(settings, tmp_path):
    """onstart + args at most 4,096 characters and a label at most 256 (create_instance.yaml),
    with a long site URL and the longest job and attempt numbers."""
    from jobs.bootstrap import render_bootstrap
    from jobs.models import Attempt

    settings.SITE_URL = "https://" + "nomadgpu-portal." * 6 + "example.com"
    settings.NOMADGPU_ENV = "production-eu-west"
    job = JobFactory.build(pk=2_147_483_647)
    attempt = Attempt(job=job, number=9_999)

    script = render_bootstrap(attempt, token="t" * 64)

    assert len(script) <= 4096, len(script)
    assert len(label_for(job, 9_999)) <= 256


def _build_many(path: str, barrier, times: int) -> None:
    barrier.wait()
    for _ in range(times):
        build_zipapp(path)


def test_worker_processes_building_the_agent_at_once_all_succeed(tmp_path):
    # Each prefork worker process builds agent.pyz on its first rent after a deploy.
    out = tmp_path / "agent" / "agent-0123.pyz"
    processes = 4
    barrier = multiprocessing.Barrier(processes)
    workers = [
        multiprocessing.Process(target=_build_many, args=(str(out), barrier, 40))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * processes
    assert sorted(p.name for p in out.parent.iterdir()) == ["agent-0123.pyz"]  # no leftovers
    assert build_zipapp(tmp_path / "ref.pyz").read_bytes() == out.read_bytes()


def refusing(sandbox, client, *, every: bool):
    """CLIENT's create, with Vast refusing the first offer tried (or EVERY one) just before it
    is sent: the sandbox answers the 403 create_instance.yaml documents for one offer."""
    real, tried = client.create_instance, []

    def create(offer_id, **kwargs):
        if every or not tried:
            sandbox.refuse_ask(offer_id)
        tried.append(offer_id)
        return real(offer_id, **kwargs)

    client.create_instance = create
    return tried


@pytest.mark.django_db
def test_an_offer_vast_refuses_is_skipped_and_the_next_one_rented(sandbox):
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        tried = refusing(sandbox, client, every=False)
        assert renting.rent(attempt.pk, now=now, client=client) == "rented"

    attempt.refresh_from_db()
    assert len(tried) == 2
    assert attempt.offer_id == tried[1] != tried[0]
    event = JobEvent.objects.get(job=job, kind="offer_refused")
    assert event.data["offer_id"] == tried[0]
    assert event.data["status"] == 403
    assert f"Offer {tried[0]} is not your own" in event.message


@pytest.mark.django_db
def test_when_every_offer_is_refused_the_reason_names_each_offer_and_what_vast_said(sandbox):
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        tried = refusing(sandbox, client, every=True)
        assert renting.rent(attempt.pk, now=now, client=client) == "no-offers"
        assert client.list_instances() == []

    attempt.refresh_from_db()
    assert attempt.end_reason == "no_offers"  # not the account: the job tries again later
    assert len(tried) == renting.MAX_CREATE_TRIES  # every chosen offer was tried, one by one
    said = JobEvent.objects.get(job=job, kind="no_offers").message
    assert all(f"Vast refused offer {offer_id} (403)" in said for offer_id in tried)
    assert JobEvent.objects.filter(job=job, kind="offer_refused").count() == len(tried)
