"""The guards of a hedged rent, each on its own (``jobs.renting.race``, ``offer_claims``):

- one offer is never bought twice: a claim per offer, before its create, even where Vast would
  sell it twice (the sandbox's ``double-sell``, skypilot#9117);
- a create that timed out is settled by its label before any further create (the sandbox's
  ``create-timeout``, skypilot#10171);
- every racer holds budget before it is created, and a race narrows to what the limits allow;
- a race where every racer fails goes on to the next offers, with no backoff.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import BudgetReservation
from hosts import selection
from hosts.models import MachineRental
from hosts.selection import machine_memory as mm
from hosts.vast import CreatedInstance, VastClient
from jobs import lifecycle, racers
from jobs.models import AttemptState, JobState, OfferClaim, Racer, RacerState
from jobs.renting import market, offer_claims, race, race_end, race_start
from jobs.renting import rent as renting
from jobs.renting.terms import profile_for, requirements_for
from jobs.watchdog import passes
from tests.support.factories import JobFactory
from tests.support.market import FIELD_REPORT_REQUIREMENTS, REFERENCE, make_offer
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet_bootstrap(monkeypatch) -> None:
    """The racers' onstart does nothing (no agent is wanted here)."""
    monkeypatch.setattr(race_start, "render_bootstrap", lambda attempt, token: "true")
    monkeypatch.setattr(renting, "render_bootstrap", lambda attempt, token: "true")


@pytest.fixture
def vast(sandbox, settings):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    settings.ORPHAN_GRACE_S = 3600
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        yield client


class Recorder:
    """The provider calls a rent made, in order, passed on to the real client."""

    def __init__(self, client: VastClient) -> None:
        self.client, self.calls = client, []

    def create_instance(self, offer_id, **kwargs):
        self.calls.append(("create", offer_id, kwargs["label"]))
        return self.client.create_instance(offer_id, **kwargs)

    def list_instances(self, **kwargs):
        self.calls.append(("list", kwargs.get("label")))
        return self.client.list_instances(**kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def planned(**fields):
    job = JobFactory(requirements=FIELD_REPORT_REQUIREMENTS, **fields)
    now = timezone.now()
    return lifecycle.plan_rent(job.pk, now=now), now


# --- One offer is never bought twice ------------------------------------------------------------


def test_an_offer_claimed_by_one_rent_is_refused_to_another_until_its_holder_ends():
    first, now = planned()
    second, _ = planned()

    assert offer_claims.claim_offer(777, attempt=first, now=now)
    assert not offer_claims.claim_offer(777, attempt=second, now=now)
    assert offer_claims.held_by_others(777, attempt=second)

    lifecycle.cancel_job(first.job_id, now=now, by="bob")  # its holder ends: the claim goes

    assert offer_claims.claim_offer(777, attempt=second, now=now)
    assert OfferClaim.objects.held().get(offer_id=777).attempt_id == second.pk


def test_two_rents_that_saw_the_same_offers_never_both_buy_one_though_vast_would_sell_it_twice(
    vast, sandbox, quiet_bootstrap, monkeypatch
):
    # Both jobs searched before either created (two rents of one pass): the same listing.
    first, now = planned(race="2")
    second, _ = planned(race="2")
    listing = market.search_offers(vast, requirements_for(first.job))
    monkeypatch.setattr(market, "search_offers", lambda client, req: listing)
    assert renting.rent(first.pk, now=now, client=vast) == "racing"
    taken = list(Racer.objects.filter(attempt=first).values_list("offer_id", flat=True))
    for offer_id in taken:
        sandbox.arm("double-sell", offer_id)  # Vast would accept a second buyer of each

    assert renting.rent(second.pk, now=now, client=vast) == "racing"

    mine = list(Racer.objects.filter(attempt=second).values_list("offer_id", flat=True))
    assert len(mine) == 2
    assert not set(mine) & set(taken)
    asks = [sandbox.debug(i.id)["ask_id"] for i in vast.list_instances()]
    assert len(asks) == len(set(asks)) == 4  # four instances, on four offers
    said = second.job.events.get(kind="race").message
    assert all(f"offer {o} is being rented by another rent" in said for o in taken)


def test_two_racers_of_one_race_are_on_two_machines(vast, quiet_bootstrap):
    attempt, now = planned(race="3")

    renting.rent(attempt.pk, now=now, client=vast)

    rows = Racer.objects.filter(attempt=attempt)
    assert rows.count() == 3
    assert len(set(rows.values_list("machine_id", flat=True))) == 3
    assert OfferClaim.objects.held().filter(attempt=attempt).count() == 3


# --- A create that timed out is settled by its label --------------------------------------------


def arm_everywhere(sandbox, hazard: str) -> None:
    offers = sandbox.client().post("/api/v0/bundles/", json={"limit": 1000}).json()["offers"]
    for offer in offers:
        if offer["gpu_name"] == "RTX 4090":
            sandbox.arm(hazard, offer["id"])


def test_a_racers_create_that_timed_out_is_found_by_its_label_before_the_next_create(
    vast, sandbox, quiet_bootstrap
):
    arm_everywhere(sandbox, "create-timeout")  # every create makes its instance, answers 504
    attempt, now = planned(race="2")
    recorder = Recorder(vast)

    assert renting.rent(attempt.pk, now=now, client=recorder) == "racing"

    one, two = Racer.objects.filter(attempt=attempt).order_by("position")
    assert recorder.calls == [
        ("create", one.offer_id, one.label),
        ("list", one.label),
        ("create", two.offer_id, two.label),
        ("list", two.label),
    ]
    listed = {i.label: i.id for i in vast.list_instances()}
    assert listed == {one.label: one.instance_id, two.label: two.instance_id}  # no duplicate
    assert (one.state, two.state) == (RacerState.RACING, RacerState.RACING)


def test_a_plain_rents_create_that_timed_out_is_adopted_by_its_label_at_once(
    vast, sandbox, quiet_bootstrap
):
    arm_everywhere(sandbox, "create-timeout")
    attempt, now = planned(race="off")
    recorder = Recorder(vast)

    assert renting.rent(attempt.pk, now=now, client=recorder) == "rented"

    attempt.refresh_from_db()
    assert [c[0] for c in recorder.calls] == ["create", "list"]
    assert [i.id for i in vast.list_instances()] == [attempt.instance_id]
    assert attempt.state == AttemptState.STARTING
    assert attempt.offer_id == recorder.calls[0][1]  # at the rates of the offer it was sent for


def test_a_racer_whose_timed_out_create_shows_no_instance_waits_for_the_watchdog(
    vast, quiet_bootstrap, monkeypatch, settings
):
    attempt, now = planned(race="2")

    def timed_out(offer_id, **kwargs):
        from hosts.vast import CreateOutcomeUnknown

        raise CreateOutcomeUnknown("read timeout", label=kwargs["label"])

    recorder = Recorder(vast)
    monkeypatch.setattr(recorder, "create_instance", timed_out)

    assert renting.rent(attempt.pk, now=now, client=recorder) == "unknown"

    attempt.refresh_from_db()
    assert attempt.state == AttemptState.REQUESTED  # nothing is created again blindly
    assert set(attempt.racers.values_list("state", flat=True)) == {RacerState.REQUESTED}
    # After the grace the watchdog voids them, and the rent is given up with its backoff.
    settings.REQUESTED_GRACE_S = 0
    later = now + timezone.timedelta(seconds=settings.ADOPT_AFTER_S + 1)
    race_end.settle_requested_race(attempt, {}, now=later)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.ENDED
    assert set(attempt.racers.values_list("state", flat=True)) == {RacerState.VOID}


# --- Every racer counts against the budget before it is created ----------------------------------


class CountingClient:
    """A provider that creates whatever it is asked, counting."""

    def __init__(self) -> None:
        self.created: list[int] = []

    def create_instance(self, offer_id, **kwargs):
        self.created.append(offer_id)
        return CreatedInstance(
            id=31_000_000 + len(self.created), instance_api_key=None, created_stopped=False,
            is_bid=None,
        )  # fmt: skip


def dear_pull_market() -> list:
    """Three alike hosts that bill $20/TB of download: a 40 GB image lost costs $0.80."""
    return [
        make_offer(id=n, machine_id=800 + n, inet_down_cost=0.02, reliability=0.99)
        for n in (1, 2, 3)
    ]


def test_every_racer_holds_budget_before_its_create_and_the_race_narrows_to_the_limit():
    job = JobFactory(
        requirements={"gpu_names": ["RTX 4090"], "rental": "on-demand"},
        profile={"image_gb": 40.0, "model_gb": 0.0, "upload_gb": 0.0},
        total_steps=300,
        race="3",
        budget_usd=Decimal("1000"),
    )
    now = timezone.now()
    attempt = lifecycle.plan_rent(job.pk, now=now)
    reserved = BudgetReservation.objects.get(job=job).amount_usd
    decision = selection.choose_offer(
        dear_pull_market(), requirements_for(job), profile_for(job), REFERENCE
    )
    plan, entries = race.plan_for(job, decision, now=now)
    holds = [plan.loser_usd(e.contender) for e in entries]
    assert holds[0] > 0.1
    # Room for the run and two racers' holds, not the third's.
    job.budget_usd = Decimal(str(round(reserved + holds[0] + holds[1] + holds[2] / 2, 3)))
    job.save(update_fields=["budget_usd"])
    job.refresh_from_db()
    attempt.job = job
    lifecycle_claim(attempt)
    client = CountingClient()

    assert (
        race_start.start_race(attempt, decision, plan, entries, client=client, now=now) == "racing"
    )

    assert client.created == [entries[0].ranked.offer.id, entries[1].ranked.offer.id]
    held = BudgetReservation.objects.get(job=job).amount_usd
    assert held == pytest.approx(reserved + holds[0] + holds[1])
    said = job.events.get(kind="race").message
    assert f"no racer on offer {entries[2].ranked.offer.id}: estimated cost" in said
    # A racer that leaves its race gives its hold back; what it spent stays the job's.
    first = Racer.objects.get(attempt=attempt, position=1)
    racers.end_racer(first, state=RacerState.LOST, reason="lost the race", now=now)
    assert BudgetReservation.objects.get(job=job).amount_usd == pytest.approx(reserved + holds[1])


def lifecycle_claim(attempt) -> None:
    """The rent's claim of a planned attempt (planned → requested), as ``rent.rent`` makes it."""
    type(attempt).objects.filter(pk=attempt.pk).update(state=AttemptState.REQUESTED)
    attempt.refresh_from_db()


# --- A race where every racer fails goes on -----------------------------------------------------


def test_a_race_where_every_racer_fails_goes_on_to_the_next_offers_without_backoff(
    vast, sandbox, quiet_bootstrap
):
    attempt, now = planned(race="2")
    assert renting.rent(attempt.pk, now=now, client=vast) == "racing"
    failed = list(attempt.racers.order_by("position"))
    for racer in failed:
        sandbox.inject(racer.instance_id, "destroy")

    report = passes.tick(now=timezone.now(), poll_provider=True)

    attempt.refresh_from_db()
    job = attempt.job
    job.refresh_from_db()
    assert (report["lost"], report["planned"]) == (1, 1)  # lost, and planned in the same pass
    assert attempt.state == AttemptState.ENDED
    assert "every racer failed to start" in attempt.interruption.detail
    assert {r.state for r in attempt.racers.all()} == {RacerState.FAILED}
    assert job.state == JobState.RENTING
    assert job.next_rent_at is None  # no backoff while offers remain
    assert set(job.avoid_machine_ids) == {r.machine_id for r in failed}
    nxt = job.attempts.get(number=2)
    assert renting.rent(nxt.pk, now=timezone.now(), client=vast) == "racing"
    again = set(nxt.racers.values_list("machine_id", flat=True))
    assert len(again) == 2
    assert not again & {r.machine_id for r in failed}


def test_a_racer_that_failed_on_its_own_is_a_rental_that_never_got_ready_in_the_memory(
    vast, sandbox, quiet_bootstrap
):
    attempt, now = planned(race="2")
    assert renting.rent(attempt.pk, now=now, client=vast) == "racing"
    first, second = attempt.racers.order_by("position")
    sandbox.inject(first.instance_id, "destroy")

    passes.tick(now=timezone.now(), poll_provider=True)

    first.refresh_from_db()
    assert first.state == RacerState.FAILED
    record = MachineRental.objects.get(racer_id=first.pk)
    assert record.attempt_id is None
    assert record.machine.machine_id == first.machine_id
    assert (record.ready_at, record.excused) == (None, "")
    assert record.incident == mm.LOST_LOADING
    assert record.cause == first.end_reason
    assert record.ended_at == first.ended_at
    memory = MachineRental.objects.memory(now=timezone.now(), machine_ids=[first.machine_id])
    assert memory.record(first.machine_id).incidents == (mm.LOST_LOADING,)
    # The one still racing is no rental of its own yet, and a loser never will be.
    assert not MachineRental.objects.filter(racer_id=second.pk).exists()
    racers.end_racer(second, state=RacerState.LOST, reason="lost the race", now=timezone.now())
    assert not MachineRental.objects.filter(racer_id=second.pk).exists()
