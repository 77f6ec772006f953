"""The team's memory of machines as plain numbers (``hosts.selection.machine_memory``): decay
with a 14-day half-life, the posteriors and their priors, what is charged, the 2-in-7-days ban,
and how an offer's expected total prices the memory in. Decided without a server."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hosts import selection
from hosts.selection import ON_DEMAND, PreemptionRates, Rental, Requirements, expected_cost
from hosts.selection import machine_memory as mm
from hosts.selection.failed_start import (
    AGENT_START_S,
    PROVISION_S,
    failed_start,
    failed_start_seconds,
)
from jobs.rent_decision import RankedOffer
from nomadgpu.humanize import money
from tests.support.market import FIELD_REPORT_JOB, REFERENCE, make_offer

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MACHINE = 48211
REQ = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=50)
JOB = replace(FIELD_REPORT_JOB, image_gb=4.0, checkpoint_every_steps=50)
RATES = PreemptionRates()


def ended(days_ago: float, *, incident: str = "", ready: bool | None = None, **fields):
    """A rental of MACHINE that ended DAYS_AGO (rented an hour before), ready unless it failed
    to start."""
    end = NOW - timedelta(days=days_ago)
    if ready is None:
        ready = incident not in mm.START_FAILURES
    return mm.RentalRecord(end - timedelta(hours=1), end, ready, incident=incident, **fields)


def memory(*rentals: mm.RentalRecord) -> mm.MachineMemory:
    return mm.MachineMemory({MACHINE: mm.remember(MACHINE, rentals, NOW)})


def offer(**changes):
    return make_offer(machine_id=MACHINE, **changes)


def test_a_rental_weighs_half_as_much_every_fourteen_days():
    assert mm.weight(timedelta(0)) == 1.0
    assert mm.weight(timedelta(days=14)) == pytest.approx(0.5)
    assert mm.weight(timedelta(days=28)) == pytest.approx(0.25)
    record = mm.remember(MACHINE, [ended(14, incident=mm.NEVER_READY), ended(0)], NOW)
    assert record.start_failures == pytest.approx(0.5)
    assert record.starts == pytest.approx(1.0)


def test_rentals_older_than_the_horizon_are_not_read():
    record = mm.remember(MACHINE, [ended(mm.HORIZON_DAYS + 1, incident=mm.NEVER_READY)], NOW)
    assert (record.rentals, record.start_failures) == (0, 0.0)


def test_the_prior_of_a_start_comes_from_reliability_and_a_new_machine_is_unknown_not_bad():
    assert mm.prior_start_failure(0.9999) == pytest.approx(0.1004)
    assert mm.prior_start_failure(0.99) == pytest.approx(0.14)
    assert mm.prior_start_failure(0.95) == pytest.approx(0.30)
    # Vast starts a new machine at 0.6: the ceiling, noema's failure share on filtered offers.
    assert mm.prior_start_failure(0.6) == mm.PRIOR_CEILING == mm.prior_start_failure(None)
    unknown = offer(reliability=0.99)
    assert mm.start_failure_chance(mm.NO_MEMORY, unknown) == pytest.approx(0.14)


def test_the_chance_a_start_fails_is_the_beta_posterior_of_decayed_failures_and_starts():
    a0, b0 = 0.14 * mm.PRIOR_STARTS, 0.86 * mm.PRIOR_STARTS
    once = memory(ended(0, incident=mm.NEVER_READY))
    assert mm.start_failure_chance(once, offer()) == pytest.approx((a0 + 1) / (a0 + b0 + 1))
    # The same failure a half-life ago counts half, and a ready start counts against it.
    old = memory(ended(14, incident=mm.LOST_LOADING), ended(0))
    assert mm.start_failure_chance(old, offer()) == pytest.approx((a0 + 0.5) / (a0 + b0 + 1.5))


def test_a_loss_that_was_not_the_machines_doing_is_not_charged():
    excused = memory(ended(0, incident=mm.NEVER_READY, excused="a supervisor outage"))
    assert mm.start_failure_chance(excused, offer()) == pytest.approx(0.14)
    record = excused.record(MACHINE)
    assert (record.incidents, record.excused, record.banned_until) == ((), 1, None)


def test_losses_per_rented_hour_are_the_gamma_posterior_with_the_models_rate_as_prior():
    record = memory(ended(0, incident=mm.LOST_RUNNING, running_h=2.0), ended(0, running_h=3.0))
    prior = 0.02
    expected = (prior * mm.PRIOR_HOURS + 1) / (mm.PRIOR_HOURS + 5.0)
    assert mm.loss_rate_per_h(record, offer(), prior) == pytest.approx(expected)
    assert mm.loss_rate_per_h(mm.NO_MEMORY, offer(), prior) == prior
    # Hours without a loss lower it below the model's.
    clean = memory(ended(0, running_h=40.0))
    assert mm.loss_rate_per_h(clean, offer(), prior) < prior


def test_two_incidents_in_seven_days_set_a_machine_aside_until_the_older_is_seven_days_old():
    banned = memory(ended(3, incident=mm.NEVER_READY), ended(1, incident=mm.STALLED))
    assert banned.record(MACHINE).banned_until == NOW - timedelta(days=3) + timedelta(days=7)
    assert mm.ban_reason(banned, offer()) == (
        f"machine {MACHINE}: 2 incidents in 7 days (never ready, stalled): "
        "not rented again before 2026-12-05 12:00 UTC"
    )
    apart = memory(ended(8, incident=mm.NEVER_READY), ended(1, incident=mm.LOST_RUNNING))
    assert mm.ban_reason(apart, offer()) is None
    one_excused = memory(
        ended(3, incident=mm.NEVER_READY, excused="outage"), ended(1, incident=mm.STALLED)
    )
    assert mm.ban_reason(one_excused, offer()) is None


def test_the_memory_reads_as_a_sentence():
    record = mm.remember(
        MACHINE,
        [
            ended(9, running_h=1.0, speed_ratio=1.5),
            ended(4, incident=mm.NEVER_READY),
            ended(1, incident=mm.LOST_LOADING),
        ],
        NOW,
    )
    words = mm.memory_words(*mm.memory_parts(record), "+$0.31")
    assert words.startswith(
        f"machine {MACHINE}: lost 2 of 3 rentals in 9 days (half-life 14 d): +$0.31 expected; "
        "never ready, lost while loading; "
    )
    shrunk = (mm.weight(timedelta(days=9)) * 1.5 + 1) / (mm.weight(timedelta(days=9)) + 1)
    assert f"{shrunk:.2f} times the s/step its DLPerf promised" in words  # with 1 rental of 1


def test_a_failed_start_costs_the_deadline_from_bytes_at_the_jobs_price_plus_what_it_billed():
    o = offer()  # 1000 Mbit/s, storage $0.0002/GB/h, download $2/TB
    seconds = failed_start_seconds(4.0, 1000.0)
    assert seconds == pytest.approx(PROVISION_S + 4 * 1024**3 * 8 / 1e9 + 60 + 20)
    failed = failed_start(o, JOB, REQ, 0.36)
    hours = seconds / 3600
    assert failed.waiting_usd == pytest.approx(0.36 * hours)
    assert failed.billed_usd == pytest.approx(0.0002 * 50 * hours + 4.0 * 2 / 1024)
    # A machine that likely holds the image has less to pull.
    assert failed_start(o, JOB, REQ, 0.36, cached_chance=0.9).seconds < seconds


def cost(o, mem):
    return expected_cost(o, JOB, REFERENCE, REQ, Rental(ON_DEMAND), RATES, memory=mem)


def test_an_offer_on_a_machine_that_failed_twice_costs_more_by_the_expected_amount():
    o = offer(reliability=0.99)
    unknown = cost(o, mm.NO_MEMORY)
    # Twice, eight days apart: priced, not set aside.
    failed = memory(ended(8, incident=mm.NEVER_READY), ended(1, incident=mm.LOST_LOADING))
    remembered = cost(o, failed)
    p, p0 = mm.start_failure_chance(failed, o), mm.start_failure_chance(mm.NO_MEMORY, o)
    assert p > p0
    assert remembered.start_failure_p == pytest.approx(p)
    assert remembered.failed_start_usd == pytest.approx(unknown.failed_start_usd)
    extra = (p - p0) * unknown.failed_start_usd
    assert remembered.expected_total_usd - unknown.expected_total_usd == pytest.approx(extra)
    # Without a memory nothing of it is priced: the total is the run and its interruptions.
    plain = expected_cost(o, JOB, REFERENCE, REQ, Rental(ON_DEMAND), RATES)
    assert plain.start_risk_usd == 0
    assert unknown.expected_total_usd == pytest.approx(
        plain.expected_total_usd + unknown.start_risk_usd
    )


def test_a_machine_that_lost_hosts_running_is_priced_with_its_own_rate():
    lossy = memory(ended(1, incident=mm.LOST_RUNNING, running_h=0.5))
    remembered, unknown = cost(offer(), lossy), cost(offer(), mm.NO_MEMORY)
    model = RATES.rate(ON_DEMAND, "RTX 4090")[0]
    assert remembered.preemptions_per_h == pytest.approx(mm.loss_rate_per_h(lossy, offer(), model))
    assert remembered.preemptions_per_h > unknown.preemptions_per_h
    assert f"machine {MACHINE}'s own rentals" in remembered.rate_source
    assert remembered.expected_total_usd > unknown.expected_total_usd


def test_the_speed_and_link_a_machine_showed_are_priced_in():
    slow = memory(ended(0, running_h=1.0, speed_ratio=1.5, link_ratio=0.5))
    remembered, unknown = cost(offer(), slow), cost(offer(), mm.NO_MEMORY)
    speed, link = mm.speed_factor(slow, MACHINE), mm.link_factor(slow, MACHINE)
    assert (speed, link) == (pytest.approx(1.25), pytest.approx(0.75))
    assert remembered.base.seconds_per_step == pytest.approx(unknown.base.seconds_per_step * speed)
    assert remembered.base.machine_speed_factor == pytest.approx(speed)
    assert remembered.base.image_pull_h == pytest.approx(unknown.base.image_pull_h / link)


def test_a_speed_this_job_measured_on_the_machine_is_not_scaled_again():
    slow = memory(ended(1, running_h=1.0, speed_ratio=1.5))
    book = replace(REFERENCE, by_machine={MACHINE: 5.0})
    measured = expected_cost(offer(), JOB, book, REQ, Rental(ON_DEMAND), RATES, memory=slow)
    assert measured.base.seconds_per_step == 5.0
    assert measured.base.machine_speed_factor == 1.0


def market():
    """The planted bad machine is the cheapest of three alike RTX 4090s."""
    return [
        offer(id=1, dph_base=0.30),
        make_offer(id=2, machine_id=2, dph_base=0.34),
        make_offer(id=3, machine_id=3, dph_base=0.36),
    ]


def choose(mem):
    return selection.choose_offer(market(), REQ, JOB, REFERENCE, memory=mem)


def test_the_ranking_prices_one_incident_and_sets_the_machine_aside_after_two_in_seven_days():
    assert choose(mm.NO_MEMORY).chosen.offer.machine_id == MACHINE
    once = choose(memory(ended(1, incident=mm.NEVER_READY)))
    # Still the cheapest after one failure: a ban is not the tool; its row says what it adds.
    assert once.chosen.offer.machine_id == MACHINE
    note = once.chosen.memory
    assert note.usd > 0
    assert note.usd < once.chosen.rental.start_risk_usd  # the prior's share was there already
    assert note.notes == ("never ready",)
    stored = RankedOffer(once.as_dict()["candidates"][0])
    assert stored.memory_words == (
        f"machine {MACHINE}: lost 1 of 1 rental in 1 day (half-life 14 d): "
        f"+{money(note.usd)} expected; never ready"
    )
    banned = memory(ended(3, incident=mm.NEVER_READY), ended(1, incident=mm.LOST_LOADING))
    twice = choose(banned)
    assert MACHINE not in [c.offer.machine_id for c in twice.candidates]
    assert twice.rejected_by_rule == {selection.RULE_MEMORY: 1}
    why = mm.ban_reason(banned, offer())
    assert twice.as_dict()["set_aside_by_memory"] == [{"machine_id": MACHINE, "detail": why}]


def test_a_failed_start_is_priced_with_the_start_deadline_s_own_allowances():
    from nomadgpu import settings as defaults

    assert PROVISION_S == defaults.START_PROVISION_S
    assert AGENT_START_S == defaults.START_BOOTSTRAP_S


# ---- the safer pick: within 3 % $/h, the machine least likely to fail the job ------------------


# A 20-hour run of the job's shape: a cent an hour outweighs what a failed start is priced at.
LONG = replace(JOB, steps_total=18_000)


def close_market(runner_up_dph: float):
    """MACHINE the cheapest at $0.300/h, machine 2 alike at RUNNER_UP_DPH."""
    return [offer(id=1, dph_base=0.30), make_offer(id=2, machine_id=2, dph_base=runner_up_dph)]


def pick(market_, mem):
    return selection.choose_offer(market_, REQ, LONG, REFERENCE, memory=mem)


def test_a_runner_up_within_three_percent_the_memory_rates_safer_is_rented_and_says_why():
    once = memory(ended(1, incident=mm.NEVER_READY))  # one failure: priced, not banned
    cheapest = selection.rank_offers(close_market(0.306), REQ, LONG, REFERENCE, memory=once)[0]
    assert cheapest.offer.machine_id == MACHINE  # the expected total alone keeps it first

    picked = pick(close_market(0.306), once)

    assert picked.chosen.offer.machine_id == 2
    assert [c.offer.machine_id for c in picked.candidates] == [2, MACHINE]  # the race's order
    risky, safe = (selection.failure_chance(c) for c in (cheapest, picked.chosen))
    assert safe < risky
    assert picked.as_dict()["safer_pick"] == (
        f"machine 2: the team's memory rates it less likely to fail the job ({safe:.0%} against "
        f"{risky:.0%} for machine {MACHINE}, the cheapest expected total) at +2.0% $/h "
        "(within 3%)"
    )


def test_the_safer_pick_never_pays_more_than_three_percent_or_moves_without_evidence():
    once = memory(ended(1, incident=mm.NEVER_READY))
    dearer = pick(close_market(0.312), once)
    assert dearer.chosen.offer.machine_id == MACHINE  # 4 % dearer: the expected total decides
    assert dearer.safer == ""
    # No rental of either machine: a higher reliability alone moves nothing.
    market_ = [offer(id=1, dph_base=0.30, reliability=0.98), *close_market(0.301)[1:]]
    fresh = pick(market_, mm.MachineMemory({}))
    assert fresh.chosen.offer.machine_id == MACHINE
    assert fresh.safer == ""
