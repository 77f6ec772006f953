"""hosts.selection prices a machine that may still hold the job's image (``ImageCache``): the
pull and its traffic at (1 - chance) of a whole one, so it ranks first when otherwise equal."""

from __future__ import annotations

import pytest

from hosts.selection import (
    ON_DEMAND,
    ImageCache,
    JobProfile,
    PreemptionRates,
    Rental,
    Requirements,
    SpeedBook,
    choose_offer,
    estimate_cost,
    expected_cost,
    outbid_choice,
    rank_offers,
    transfer_hours,
)
from hosts.vast import parse_offer

RAW = {  # one healthy RTX 4090 with metered traffic, in the market's field names and units
    "id": 16018470,
    "machine_id": 30941,
    "gpu_name": "RTX 4090",
    "num_gpus": 1,
    "gpu_ram": 24564,
    "disk_space": 500.0,
    "dph_base": 0.36,
    "storage_cost": 0.144,
    "inet_down": 500.0,
    "inet_up": 500.0,
    "inet_down_cost": 10 / 1024,  # $10/TB
    "inet_up_cost": 3 / 1024,
    "reliability": 0.99,
    "verification": "verified",
    "dlperf": 100.0,
}
REQ = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=50)
# The field-report shape: a 4 GB image, a 15 GB model.
PROFILE = JobProfile(image_gb=4.0, model_gb=15.0, upload_gb=1.0, steps_total=300)
SPEEDS = SpeedBook(dlperf_by_model={"RTX 4090": 100.0})


def offer(**changes):
    return parse_offer({**RAW, **changes})


def test_a_machine_that_surely_kept_the_image_costs_no_pull_time_or_image_traffic():
    plain = estimate_cost(offer(), PROFILE, SPEEDS, REQ)
    cached = estimate_cost(
        offer(), PROFILE, SPEEDS, REQ, images=ImageCache(by_machine={30941: 1.0})
    )

    assert plain.image_pull_h == pytest.approx(transfer_hours(4.0, 500.0))
    assert cached.image_pull_h == 0.0
    assert cached.image_cached_chance == 1.0
    assert cached.download_gb == pytest.approx(plain.download_gb - 4.0)
    assert cached.startup_h == pytest.approx(plain.startup_h - plain.image_pull_h)
    # The pull is storage and traffic, never GPU time: the GPU dollars do not move.
    assert cached.gpu_usd == pytest.approx(plain.gpu_usd)
    saved = 4.0 * (10 / 1024) + 0.144 / 720 * 50 * plain.image_pull_h
    assert plain.total_usd - cached.total_usd == pytest.approx(saved)


def test_the_pull_is_priced_at_the_chance_the_host_wiped_the_image():
    plain = estimate_cost(offer(), PROFILE, SPEEDS, REQ)
    likely = estimate_cost(
        offer(), PROFILE, SPEEDS, REQ, images=ImageCache(by_machine={30941: 0.8})
    )

    assert likely.image_pull_h == pytest.approx(0.2 * plain.image_pull_h)
    assert likely.download_gb == pytest.approx(plain.download_gb - 0.8 * 4.0)


def test_a_measured_pull_is_discounted_the_same_way():
    measured = JobProfile(image_gb=4.0, model_gb=15.0, upload_gb=1.0, steps_total=300, pull_s=90)
    cost = estimate_cost(offer(), measured, SPEEDS, REQ, images=ImageCache(by_machine={30941: 0.5}))
    assert cost.image_pull_h == pytest.approx(45 / 3600)


def test_another_machines_history_changes_nothing():
    plain = estimate_cost(offer(), PROFILE, SPEEDS, REQ)
    other = estimate_cost(offer(), PROFILE, SPEEDS, REQ, images=ImageCache(by_machine={7: 1.0}))
    assert other == plain


def test_a_machine_that_pulled_the_image_ranks_first_when_otherwise_equal():
    # Without history the lower id wins the tie; the machine that pulled the image takes it.
    first, second = offer(id=100, machine_id=1), offer(id=200, machine_id=2)
    images = ImageCache(by_machine={2: 0.8})

    assert [r.offer.id for r in rank_offers([first, second], REQ, PROFILE, SPEEDS)] == [100, 200]
    ranked = rank_offers([first, second], REQ, PROFILE, SPEEDS, images=images)
    assert [r.offer.id for r in ranked] == [200, 100]
    assert ranked[0].expected_total_usd < ranked[1].expected_total_usd


def test_the_decision_records_the_chance_for_the_page():
    decision = choose_offer(
        [offer(id=100, machine_id=1), offer(id=200, machine_id=2)],
        REQ,
        PROFILE,
        SPEEDS,
        images=ImageCache(by_machine={2: 0.8}),
    )
    data = decision.as_dict()
    assert data["chosen_offer_id"] == 200
    chances = {c["offer"]["id"]: c["cost"]["image_cached_chance"] for c in data["candidates"]}
    assert chances == {200: 0.8, 100: 0.0}


def test_a_recovery_is_priced_with_a_whole_pull_on_another_machine():
    # The replacement after an interruption is another machine: its pull is not discounted.
    rental, rates = Rental(ON_DEMAND), PreemptionRates()
    plain = expected_cost(offer(), PROFILE, SPEEDS, REQ, rental, rates)
    cached = expected_cost(
        offer(), PROFILE, SPEEDS, REQ, rental, rates, ImageCache(by_machine={30941: 1.0})
    )
    assert cached.rework_usd == pytest.approx(plain.rework_usd)
    assert cached.rework_h == pytest.approx(plain.rework_h)
    assert cached.base.total_usd < plain.base.total_usd


def test_model_on_disk_is_said_only_of_staying_on_the_same_instance():
    numbers = {
        "steps_left": 1800,
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
    stay = outbid_choice(**numbers)
    move = outbid_choice(**{**numbers, "move_usd_per_hour": 0.18})

    assert stay.raise_to is not None
    assert "the same instance: image cached, model on disk" in stay.why
    assert move.raise_to is None
    assert "model on disk" not in move.why
