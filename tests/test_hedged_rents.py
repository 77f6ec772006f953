"""A hedged rent against the sandbox over HTTP (``jobs.renting.race``): k instances on k
machines, each with its own label and agent token; the first racer whose agent registers gets
the attempt, the others are lost (their agents get 410) and destroyed; the timeline says which
host was kept and what the others cost; the watchdog leaves racers alone while their race is
open and destroys a lost one's instance at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.cost import job_cost
from billing.spend import racer_spend
from hosts.models import MachineRental
from hosts.selection import machine_memory as mm
from hosts.vast import VastClient
from jobs import lifecycle
from jobs.models import AttemptState, JobEvent, Racer, RacerState, parse_label
from jobs.rent_decision import RentDecision
from jobs.renting import race_end, race_start
from jobs.renting import rent as renting
from jobs.watchdog import passes
from jobs.watchdog import start_deadline as sd
from nomadgpu.humanize import duration, money
from tests.support.agent_api import call
from tests.support.factories import JobFactory, make_attempt
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db

REGISTER = {"agent_version": "0.1.0"}


@pytest.fixture
def tokens(monkeypatch) -> list[str]:
    """Each racer's agent token as its create carried it (its onstart does nothing here)."""
    issued: list[str] = []
    monkeypatch.setattr(
        race_start, "render_bootstrap", lambda attempt, token: issued.append(token) or "true"
    )
    return issued


@pytest.fixture
def vast(sandbox, settings):
    """A client of the sandbox, which the watchdog's poll reaches too."""
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    settings.ORPHAN_GRACE_S = 3600  # the orphan reaper's grace: never what destroys here
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        yield client


def raced(vast, *, k: int = 2, **fields):
    """A job with ``race = k`` whose rent ran: (its attempt, now)."""
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS, race=str(k), **fields)
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    assert renting.rent(attempt.pk, now=now, client=vast) == "racing"
    attempt.refresh_from_db()
    return attempt, now


def test_a_race_creates_one_instance_per_racer_on_different_machines(vast, tokens):
    attempt, _ = raced(vast, k=2)

    racers = list(attempt.racers.order_by("position"))
    listed = {i.id: i for i in vast.list_instances()}
    assert [r.state for r in racers] == [RacerState.RACING, RacerState.RACING]
    assert set(listed) == {r.instance_id for r in racers}
    assert len({r.machine_id for r in racers}) == 2
    assert len({r.offer_id for r in racers}) == 2
    # Each its own label, read as the attempt's; each its own token.
    assert [listed[r.instance_id].label for r in racers] == [r.label for r in racers]
    assert {parse_label(r.label) for r in racers} == {(attempt.job_id, attempt.number)}
    assert len(set(tokens)) == 2
    # The attempt is starting with no instance of its own: the race is open.
    assert (attempt.state, attempt.instance_id, attempt.raced) == (AttemptState.STARTING, None, 2)
    assert RentDecision.of(attempt).race["k"] == 2
    race_event = JobEvent.objects.get(job_id=attempt.job_id, kind="race")
    assert race_event.message.startswith("racing 2 hosts (race = N)")


def test_the_first_racer_to_register_gets_the_attempt_and_the_others_token_dies(
    vast, tokens, client
):
    attempt, _ = raced(vast, k=2)
    first, second = attempt.racers.order_by("position")

    won = call(client, tokens[1], "register", REGISTER)
    late = call(client, tokens[0], "register", REGISTER)

    assert won.status_code == 200
    assert late.status_code == 410
    assert "lost the race" in late.json()["detail"]
    attempt.refresh_from_db()
    second.refresh_from_db()
    first.refresh_from_db()
    # The winner's instance, token and rates are the attempt's: one instance per attempt.
    assert attempt.instance_id == second.instance_id
    assert attempt.token_prefix == second.token_prefix
    assert (attempt.offer_id, attempt.machine_id) == (second.offer_id, second.machine_id)
    assert attempt.dph_base == second.dph_base
    assert attempt.rented_at == second.rented_at
    assert attempt.registered_at is not None
    assert RentDecision.of(attempt).chosen_offer["id"] == second.offer_id
    assert (second.state, first.state) == (RacerState.WON, RacerState.LOST)
    # Its heartbeats go on as the attempt's; the loser's are refused.
    beat = {"seq": 1, "phase": "starting", "gpu": {"ok": True}}
    assert call(client, tokens[1], "heartbeat", beat).status_code == 200
    assert call(client, tokens[0], "heartbeat", beat).status_code == 410


def test_a_racer_may_fetch_the_agent_before_it_registers_but_not_beat(vast, tokens, client):
    raced(vast, k=2)
    auth = {"Authorization": f"Bearer {tokens[0]}"}

    assert client.get("/api/agent/bootstrap.sh", headers=auth).status_code == 200
    beat = {"seq": 1, "phase": "starting", "gpu": {"ok": True}}
    assert call(client, tokens[0], "heartbeat", beat).status_code == 503  # wait: not won


def test_the_timeline_says_which_host_was_kept_and_what_the_loser_cost(vast, tokens, client):
    attempt, _ = raced(vast, k=2)
    first, second = attempt.racers.order_by("position")
    # Both were created 71 s ago; the loser was pulling its image.
    created = timezone.now() - timedelta(seconds=71)
    Racer.objects.filter(attempt=attempt).update(rented_at=created)
    Racer.objects.filter(pk=second.pk).update(provider_status="loading", loading_at=created)

    assert call(client, tokens[0], "register", REGISTER).status_code == 200

    second.refresh_from_db()
    event = JobEvent.objects.get(job_id=attempt.job_id, kind="race_won")
    loser_cost = racer_spend(second, now=second.ended_at).total
    assert loser_cost > 0
    assert event.message == (
        f"raced 2 hosts: kept {first.instance_id} (ready in {duration(71)}), destroyed "
        f"{second.instance_id} while loading ({money(loser_cost)})"
    )
    # The loser's storage and pull are the job's cost, as any attempt's would be.
    cost = job_cost(attempt.job, now=timezone.now())
    assert cost.as_dict()["storage"] >= round(racer_spend(second, now=second.ended_at).storage, 6)


def test_the_job_page_says_why_it_raced_and_which_host_it_kept(vast, tokens, client, cast):
    attempt, _ = raced(vast, k=2, team=cast.team_a)
    first, second = attempt.racers.order_by("position")
    assert call(client, tokens[0], "register", REGISTER).status_code == 200
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()

    assert "Racing 2 hosts (race = N): a host expected in" in html
    assert f"raced 2 hosts: kept {first.instance_id} (ready in" in html
    assert f"destroyed {second.instance_id}" in html
    assert "raced 2 hosts</li>" in html or "· raced 2 hosts" in html


def test_the_poll_leaves_an_open_race_alone_and_destroys_a_losers_instance_at_once(
    vast, tokens, client, sandbox
):
    attempt, _ = raced(vast, k=2)
    first, second = attempt.racers.order_by("position")

    passes.tick(now=timezone.now(), poll_provider=True)
    assert {i.id for i in vast.list_instances()} == {first.instance_id, second.instance_id}

    assert call(client, tokens[0], "register", REGISTER).status_code == 200
    # The destroy sent after the win's commit is not run here: the next poll destroys it.
    passes.tick(now=timezone.now() + timedelta(seconds=1), poll_provider=True)

    assert {i.id for i in vast.list_instances()} == {first.instance_id}
    assert sandbox.debug(second.instance_id)["destroyed_by"]
    second.refresh_from_db()
    assert second.destroyed_at is not None


def test_the_destroy_after_a_win_stops_the_losers_billing(vast, tokens, client, sandbox):
    attempt, _ = raced(vast, k=2)
    first, second = attempt.racers.order_by("position")
    assert call(client, tokens[0], "register", REGISTER).status_code == 200

    assert race_end.destroy_racer_instance(second.pk, now=timezone.now(), client=vast)
    assert not race_end.destroy_racer_instance(first.pk, now=timezone.now(), client=vast)  # kept

    assert sandbox.debug(second.instance_id)["billing_now"] == []
    assert {i.id for i in vast.list_instances()} == {first.instance_id}


def test_a_racer_whose_host_fails_is_out_and_its_machine_avoided_while_the_other_races_on(
    vast, tokens, sandbox
):
    attempt, _ = raced(vast, k=2)
    first, _ = attempt.racers.order_by("position")

    sandbox.inject(first.instance_id, "destroy")  # its host is lost while it loads
    passes.tick(now=timezone.now(), poll_provider=True)

    first.refresh_from_db()
    attempt.refresh_from_db()
    assert first.state == RacerState.FAILED
    assert first.end_reason.startswith("provider_")
    assert attempt.state == AttemptState.STARTING  # the other races on
    attempt.job.refresh_from_db()
    assert first.machine_id in attempt.job.avoid_machine_ids
    said = JobEvent.objects.get(job_id=attempt.job_id, kind="racer_failed").message
    assert said.startswith(f"racer 1 (instance {first.instance_id}, machine {first.machine_id})")
    assert said.endswith("1 still racing")


def test_cancelling_a_job_mid_race_ends_every_racer(vast, tokens, client):
    attempt, _ = raced(vast, k=2)

    lifecycle.cancel_job(attempt.job_id, now=timezone.now(), by="bob")

    assert set(attempt.racers.values_list("state", flat=True)) == {RacerState.LOST}
    assert call(client, tokens[0], "register", REGISTER).status_code == 410


# ---- each racer's own start deadline ---------------------------------------------------------


def racer_start_s(attempt, racer, mbps: float, margin: float) -> float:
    """Seconds from RACER's create to its start deadline: Vast's start, the profile's 5 GB image
    at MBPS times MARGIN (no machine of a new team holds it), the agent's start."""
    pull = 5.0 * 1024**3 * 8 / (mbps * 1e6) * margin
    return sd.VAST_START_S + pull + sd.AGENT_START_S


def test_each_racer_is_held_to_its_own_machines_link_and_the_race_to_the_last_of_them(
    vast, tokens, sandbox, monkeypatch
):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)  # the replacement's rent
    attempt, _ = raced(vast, k=2)
    first, second = attempt.racers.order_by("position")
    for racer in (first, second):
        sandbox.inject(racer.instance_id, "stuck-loading")  # its pull hangs: no agent, ever
    # The team's agents measured racer 2's machine before: that link, not its offer's, times it.
    earlier = JobFactory(team=attempt.job.team)
    make_attempt(earlier, state="ended", machine_id=second.machine_id, link_mbps=900.0)
    advertised = RentDecision(RentDecision.of(attempt).with_chosen(first.offer_id)).download_mbps
    expected = {
        first.pk: first.rented_at
        + timedelta(seconds=racer_start_s(attempt, first, advertised, sd.ADVERTISED_MARGIN)),
        second.pk: second.rented_at
        + timedelta(seconds=racer_start_s(attempt, second, 900.0, sd.MEASURED_MARGIN)),
    }

    passes.tick(now=timezone.now(), poll_provider=True)  # the first poll sets each deadline

    for racer in (first, second):
        racer.refresh_from_db()
        assert racer.start_due_at == pytest.approx(
            expected[racer.pk], abs=timedelta(milliseconds=1)
        )
    assert "Mbit/s advertised" in first.start_due_why
    assert "at 900 Mbit/s measured" in second.start_due_why
    sooner, later = sorted((first, second), key=lambda r: r.start_due_at)
    attempt.refresh_from_db()
    assert attempt.start_due_at == later.start_due_at  # the race runs out with its last racer
    assert attempt.start_due_why.startswith(f"the last of 2 racers, racer {later.position}: ")

    # Past the sooner racer's deadline, before the later's: it alone fails, on its own clock.
    passes.tick(now=sooner.start_due_at + timedelta(seconds=1), poll_provider=True)

    sooner.refresh_from_db()
    later.refresh_from_db()
    attempt.refresh_from_db()
    assert (sooner.state, sooner.end_reason) == (RacerState.FAILED, "start_overdue")
    assert later.state == RacerState.RACING
    assert attempt.state == AttemptState.STARTING
    assert attempt.start_due_why.startswith(f"its one racer left, racer {later.position}: ")
    attempt.job.refresh_from_db()
    assert sooner.machine_id in attempt.job.avoid_machine_ids
    said = JobEvent.objects.get(job_id=attempt.job_id, kind="racer_failed").message
    assert "failed: start_overdue (not running" in said
    assert said.endswith("1 still racing")
    rental = MachineRental.objects.get(racer_id=sooner.pk)
    assert (rental.incident, rental.excused) == (mm.NEVER_READY, "")

    passes.tick(now=later.start_due_at + timedelta(seconds=1), poll_provider=True)

    attempt.refresh_from_db()
    assert attempt.state == AttemptState.ENDED
    assert attempt.end_reason == "start_overdue"
    assert attempt.job.attempts.filter(number=2, state="planned").exists()  # the next offers
