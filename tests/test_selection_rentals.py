"""On-demand or interruptible, and at what bid: the expected total cost with interruptions
(``hosts.selection.expected_cost``), decided without a server."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hosts import selection
from hosts.selection import (
    AUTO,
    INTERRUPTIBLE,
    ON_DEMAND,
    JobProfile,
    PreemptionRates,
    Rental,
    Requirements,
    choose_offer,
    expected_cost,
)
from jobs.rent_decision import RentDecision
from tests.support.market import FIELD_REPORT_JOB, REFERENCE, make_offer

FIELD_REPORT = replace(FIELD_REPORT_JOB, checkpoint_every_steps=50)  # 300 steps, 15 GB model
REQ = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=50)
PRIOR = PreemptionRates()


def cost(offer, rental, *, rates=PRIOR, profile=FIELD_REPORT, req=REQ):
    return expected_cost(offer, profile, REFERENCE, req, rental, rates)


def test_a_bid_is_min_bid_plus_its_margin_and_an_offer_without_min_bid_takes_none():
    offer = make_offer(min_bid=0.20)
    assert Rental(INTERRUPTIBLE, 0.25).gpu_usd_per_hour(offer) == pytest.approx(0.25)
    assert Rental(ON_DEMAND).gpu_usd_per_hour(offer) == offer.dph_base
    assert Rental(INTERRUPTIBLE).gpu_usd_per_hour(make_offer(min_bid=None)) is None
    assert cost(make_offer(min_bid=None), Rental(INTERRUPTIBLE)) is None


def test_each_interruption_costs_detection_a_rent_a_start_up_and_half_an_interval():
    offer = make_offer(min_bid=0.20)
    bid = cost(offer, Rental(INTERRUPTIBLE, 0.0))
    # 15 GB at 1000 Mbit/s, 60 s container start, half of 50 steps x 4 s, 30 s + 20 s waiting.
    download_h = 15 * 1024**3 * 8 / 1e9 / 3600
    assert bid.rework_h == pytest.approx(download_h + (60 + 100 + 50) / 3600)
    assert bid.preemptions_per_h == pytest.approx(selection.prior_rate(INTERRUPTIBLE, 0.0))
    lam, work = bid.preemptions_per_h, bid.base.wall_h
    assert bid.expected_preemptions == pytest.approx(lam * work / (1 - lam * bid.rework_h))
    assert bid.expected_total_usd == pytest.approx(
        bid.base.total_usd + bid.expected_preemptions * bid.rework_usd
    )
    assert bid.expected_wall_h > bid.base.wall_h


def test_a_higher_bid_is_interrupted_less_and_the_model_pays_for_it_when_rework_is_dear():
    offer = make_offer(min_bid=0.12)
    at_floor = cost(offer, Rental(INTERRUPTIBLE, 0.0))
    higher = cost(offer, Rental(INTERRUPTIBLE, 0.5))
    assert higher.preemptions_per_h < at_floor.preemptions_per_h
    # A long job with a big model: redoing the start-up often costs more than a higher bid.
    long_job = replace(FIELD_REPORT, steps_total=30_000, checkpoint_every_steps=5_000)
    best = selection.best_rental(
        offer, long_job, REFERENCE, replace(REQ, rental=INTERRUPTIBLE), PRIOR
    )
    assert best.rental.bid_margin > 0


def test_auto_bids_on_a_cheap_floor_and_rents_on_demand_when_the_floor_is_near_the_price():
    cheap_floor = make_offer(id=1, min_bid=0.12)  # a third of the $0.36 on-demand price
    dear_floor = make_offer(id=2, min_bid=0.35)
    auto = replace(REQ, rental=AUTO)
    chosen = selection.best_rental(cheap_floor, FIELD_REPORT, REFERENCE, auto, PRIOR)
    assert chosen.rental.kind == INTERRUPTIBLE
    assert chosen.expected_total_usd < cost(cheap_floor, Rental(ON_DEMAND)).expected_total_usd
    assert selection.best_rental(dear_floor, FIELD_REPORT, REFERENCE, auto, PRIOR).rental == (
        Rental(ON_DEMAND)
    )


def test_history_replaces_the_prior_as_rented_hours_accumulate():
    gpu = "RTX 4090"
    calm = PreemptionRates({(INTERRUPTIBLE, gpu, 0.0): (0, 200.0)})  # 200 h without a loss
    stormy = PreemptionRates({(INTERRUPTIBLE, gpu, 0.0): (400, 200.0)})  # two an hour
    prior, source = PRIOR.rate(INTERRUPTIBLE, gpu, 0.0)
    assert source == "prior"
    assert calm.rate(INTERRUPTIBLE, gpu, 0.0)[0] < prior / 10
    assert stormy.rate(INTERRUPTIBLE, gpu, 0.0)[0] > 1.5
    assert calm.rate(INTERRUPTIBLE, "RTX 3090", 0.0) == (prior, "prior")  # per GPU model


def test_auto_moves_to_on_demand_when_the_team_saw_bids_lost_all_the_time():
    offer = make_offer(min_bid=0.18)
    stormy = PreemptionRates(
        {(INTERRUPTIBLE, "RTX 4090", m): (2000, 200.0) for m in selection.BID_MARGINS}
    )
    auto = replace(REQ, rental=AUTO)
    assert selection.best_rental(offer, FIELD_REPORT, REFERENCE, auto, stormy).rental == (
        Rental(ON_DEMAND)
    )


def test_interruptions_faster_than_the_work_never_finish_and_are_never_chosen():
    storm = PreemptionRates({(INTERRUPTIBLE, "RTX 4090", 0.0): (1000, 10.0)})  # ~100 an hour
    offer = make_offer(min_bid=0.10)
    assert math.isinf(cost(offer, Rental(INTERRUPTIBLE, 0.0), rates=storm).expected_total_usd)
    rental = selection.best_rental(offer, FIELD_REPORT, REFERENCE, replace(REQ, rental=AUTO), storm)
    assert rental.rental != Rental(INTERRUPTIBLE, 0.0)


def test_interruptible_only_refuses_offers_that_take_no_bid_and_bids_over_the_cap():
    offers = [
        make_offer(id=1, machine_id=1, min_bid=None),
        make_offer(id=2, machine_id=2, min_bid=0.3),
    ]
    capped = replace(REQ, rental=INTERRUPTIBLE, max_bid_dph=0.25)
    assert choose_offer(offers, capped, FIELD_REPORT, REFERENCE) is None
    decision = choose_offer(offers, replace(REQ, rental=INTERRUPTIBLE), FIELD_REPORT, REFERENCE)
    assert decision.chosen_offer_id == 2
    assert decision.rejected_by_rule == {selection.NOT_BIDDABLE: 1}
    assert decision.bid_usd_per_hour == pytest.approx(decision.chosen.rental.gpu_usd_per_hour)


def test_the_decision_records_the_rental_its_rate_and_the_alternatives_as_json():
    offers = [make_offer(id=7, machine_id=7, min_bid=0.12)]
    decision = choose_offer(offers, replace(REQ, rental=AUTO), FIELD_REPORT, REFERENCE)
    data = json.loads(json.dumps(decision.as_dict()))
    assert data["rental"]["rental"]["kind"] == INTERRUPTIBLE
    assert data["rental"]["rate_source"] == "prior"
    assert data["rental"]["preemptions_per_h"] > 0
    kinds = {a["rental"]["kind"] for a in data["alternatives"]}
    assert kinds == {ON_DEMAND, INTERRUPTIBLE}  # on-demand and the other margins
    cheapest = min(a["expected_total_usd"] for a in data["alternatives"])
    assert data["estimated_total_usd"] <= cheapest


def test_an_on_demand_job_still_never_bids():
    offers = [make_offer(id=7, machine_id=7, min_bid=0.01)]
    decision = choose_offer(offers, REQ, FIELD_REPORT, REFERENCE)
    assert decision.bid_usd_per_hour is None
    assert all(a["rental"]["kind"] == ON_DEMAND for a in [decision.as_dict()["rental"]])


def test_a_job_that_does_not_say_its_interval_is_taken_to_checkpoint_ten_times():
    profile = JobProfile(image_gb=0, model_gb=0, upload_gb=0, steps_total=1000)
    assert selection.checkpoint_interval_h(profile, 3.6) == pytest.approx(100 * 3.6 / 3600)


def outbid(**changes):
    numbers = {
        "steps_left": 1800,  # 2 h at 4 s a step
        "stay_seconds_per_step": 4.0,
        "new_min_bid": 0.20,
        "bid_margin": 0.15,
        "stay_outbids_per_h": 0.1,
        "restart_h": 0.05,
        "cap_usd_per_hour": 0.36,
        "move_usd_per_hour": 0.30,
        "move_seconds_per_step": 4.0,
        "move_interruptions_per_h": 0.02,
        "move_rework_usd": 0.10,
    }
    return selection.outbid_choice(**{**numbers, **changes})


def test_an_outbid_job_raises_its_bid_when_waiting_is_cheaper_than_moving():
    choice = outbid()

    assert choice.raise_to == pytest.approx(0.23 + selection.RAISE_STEP_USD)  # never a tie
    restarts = 1 + 0.1 * 2.0  # this one and the outbids still expected at this margin
    assert choice.stay_usd == pytest.approx(choice.raise_to * (2.0 + restarts * 0.05))
    assert choice.move_usd == pytest.approx(0.30 * 2 + 0.10 * (1 + 0.02 * 2))
    assert "raise the bid to $0.2310/h" in choice.why


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"new_min_bid": 0.40}, "the new bid would pass the cap (on-demand price, max bid)"),
        ({"new_min_bid": 0.3120}, "a raise to exactly the on-demand price never pays"),
        ({"move_usd_per_hour": 0.18}, "another machine is cheaper for the hours left"),
        ({"move_seconds_per_step": 2.0, "move_usd_per_hour": 0.36}, "so is a faster dearer one"),
        ({"stay_outbids_per_h": 40.0}, "staying would be outbid again and again"),
        ({"new_min_bid": None}, "no floor given: nothing to bid over"),
    ],
)
def test_an_outbid_job_moves_when_staying_would_cost_more(changes, why):
    choice = outbid(**changes)

    assert choice.raise_to is None, why
    assert choice.why.startswith("move")


def test_the_move_is_the_decisions_best_candidate_on_another_machine():
    offers = [
        make_offer(id=1, machine_id=1, min_bid=0.12),
        make_offer(id=2, machine_id=2, min_bid=0.15, dph_base=0.40),
    ]
    decision = choose_offer(offers, replace(REQ, rental=AUTO), FIELD_REPORT, REFERENCE).as_dict()
    assert decision["chosen"]["offer"]["machine_id"] == 1
    second = decision["candidates"][1]["rental"]

    choice = RentDecision(decision).outbid_choice(
        machine_id=1,
        steps_left=150,
        seconds_per_step=None,
        bid_margin=decision["rental"]["rental"]["bid_margin"],
        new_min_bid=0.5,  # over the machine's $0.36 on demand: never raised
        max_bid_dph=None,
        rates=PRIOR,
    )

    assert choice.raise_to is None
    move_h = 150 * 4.0 / 3600
    rework = second["rework_usd"] - second["gpu_usd_per_hour"] * second["redo_h"]
    expected = second["gpu_usd_per_hour"] * move_h + rework * (
        1 + second["preemptions_per_h"] * move_h
    )
    assert choice.move_usd == pytest.approx(expected)


def test_a_run_of_thousands_of_hours_is_still_rented_though_it_never_finishes_in_expectation():
    endless = JobProfile(image_gb=3, model_gb=0, upload_gb=0, steps_total=1_000_000)
    decision = choose_offer([make_offer(min_bid=None)], REQ, endless, REFERENCE)

    assert decision is not None  # an on-demand job is not turned away for its length
    assert decision.as_dict()["estimated_total_usd"] is None or math.isfinite(
        decision.as_dict()["estimated_total_usd"]
    )
    assert selection.checkpoint_interval_h(endless, 4.0) == selection.UNKNOWN_INTERVAL_MAX_H
