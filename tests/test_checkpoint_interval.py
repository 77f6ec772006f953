"""The Young/Daly interval as plain decisions: the formula, its clamps, λ and δ, when to ask."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from hosts import selection
from jobs.checkpoints import interval as ci

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def choose(
    rate_per_h: float, delta_s: float, heartbeat_s: float = 15.0, remaining_s: float | None = None
) -> ci.IntervalChoice:
    return ci.choose_interval(
        rate_per_h=rate_per_h,
        rate_source="prior",
        delta_s=delta_s,
        delta_source="measured",
        heartbeat_s=heartbeat_s,
        remaining_s=remaining_s,
    )


def test_young_daly_is_the_square_root_of_two_delta_mtbf():
    assert ci.young_daly_interval_s(30, 3600) == pytest.approx(math.sqrt(2 * 30 * 3600))


def test_young_daly_refuses_a_zero_cost_or_mtbf():
    with pytest.raises(ValueError):
        ci.young_daly_interval_s(0, 3600)


def test_the_interval_uses_mtbf_as_one_over_lambda():
    choice = choose(rate_per_h=1.0, delta_s=30)

    assert choice.mtbf_s == 3600
    assert choice.interval_s == pytest.approx(math.sqrt(2 * 30 * 3600))
    assert "λ 1.000/h (prior)" in choice.why
    assert "δ 30 s (measured)" in choice.why


def test_a_very_flaky_host_is_clamped_to_a_minute():
    choice = choose(rate_per_h=100.0, delta_s=1)

    assert choice.interval_s == ci.MIN_INTERVAL_S
    assert "clamped" in choice.why


def test_the_interval_is_never_under_two_heartbeats():
    assert choose(rate_per_h=100.0, delta_s=1, heartbeat_s=120).interval_s == 240


def test_a_host_that_never_fails_is_clamped_to_six_hours():
    choice = choose(rate_per_h=0.0, delta_s=60)

    assert choice.interval_s == ci.MAX_INTERVAL_S
    assert choice.as_dict()["mtbf_s"] is None  # JSON has no infinity


def test_without_machine_history_the_rental_rate_is_used_as_is():
    rate, source = ci.failure_rate_per_h(rental_rate_per_h=0.02, rental_source="prior")

    assert (rate, source) == (0.02, "prior")


def test_a_machine_with_a_long_clean_record_lowers_the_rate():
    rate, source = ci.failure_rate_per_h(
        rental_rate_per_h=0.02, rental_source="prior", machine_interruptions=0, machine_hours=90
    )

    assert rate == pytest.approx(0.02 * 10 / 100)  # the prior weighs 10 h
    assert source.startswith("machine 0 in 90.0 h")


def test_a_machine_that_failed_often_raises_the_rate():
    rate, _ = ci.failure_rate_per_h(
        rental_rate_per_h=0.02, rental_source="prior", machine_interruptions=5, machine_hours=10
    )

    assert rate == pytest.approx((5 + 0.2) / 20)


def test_a_bids_outbid_share_is_kept_when_the_machine_record_replaces_host_loss():
    bid = selection.prior_rate(selection.INTERRUPTIBLE)
    rate, _ = ci.failure_rate_per_h(
        rental_rate_per_h=bid,
        rental_source="prior",
        host_loss_per_h=selection.PRIOR_HOST_LOSS_PER_H,
        machine_interruptions=0,
        machine_hours=1000,
    )

    outbids = bid - selection.PRIOR_HOST_LOSS_PER_H
    assert outbids < rate < bid


def test_delta_is_the_median_of_this_hosts_uploads():
    delta = ci.checkpoint_cost_s(
        this_host_s=[10.0, 40.0, 20.0], size_bytes=2**30, upload_mbps=100, elsewhere_s=[90.0]
    )

    assert delta == (20.0, "median of 3 uploads on this host")


def test_before_its_first_upload_delta_is_the_size_over_the_advertised_speed():
    # 1 GiB at 800 Mbit/s: 10.7 s, and the fixed cost of asking, completing, verifying.
    delta, source = ci.checkpoint_cost_s(size_bytes=2**30, upload_mbps=800, elsewhere_s=[90.0])

    assert delta == pytest.approx(2**30 * 8 / 800e6 + ci.UPLOAD_OVERHEAD_S)
    assert source == "1.0 GB at the host's advertised 800 Mbit/s up"


def test_without_size_or_speed_the_uploads_on_earlier_hosts_are_used():
    assert ci.checkpoint_cost_s(upload_mbps=800, elsewhere_s=[30.0, 50.0]) == (
        40.0,
        "median of 2 uploads on earlier hosts",
    )
    assert ci.checkpoint_cost_s(size_bytes=2**30, elsewhere_s=[30.0])[0] == 30.0


def test_delta_is_the_default_until_anything_is_known():
    assert ci.checkpoint_cost_s() == (ci.DEFAULT_DELTA_S, "default until measured")


def test_a_long_job_is_split_at_about_the_young_daly_interval():
    # τ = √(2·20·3600) = 379 s; 3800 s left: 10.02 intervals' worth, so 10.
    assert ci.split_remaining(3800, delta_s=20, mtbf_s=3600) == 10


def test_a_short_rest_of_a_job_asks_for_no_checkpoint():
    # 300 s left, δ 15 s, MTBF 1 h: a checkpoint costs 15 s; skipping it risks 300²/7200 = 12.5.
    assert ci.split_remaining(300, delta_s=15, mtbf_s=3600) == 1


def test_the_split_compares_both_whole_numbers_around_the_optimum():
    # With R = k·τ (τ² = 2δM), one interval costs k²·δ and two δ + k²·δ/2: two pay from k = √2.
    tau = ci.young_daly_interval_s(10, 3600)
    assert ci.split_remaining(1.40 * tau, delta_s=10, mtbf_s=3600) == 1
    assert ci.split_remaining(1.45 * tau, delta_s=10, mtbf_s=3600) == 2


def test_a_host_that_never_fails_needs_no_checkpoint_before_the_end():
    assert ci.split_remaining(3600, delta_s=20, mtbf_s=math.inf) == 1


def test_the_interval_spreads_the_rest_of_the_job_evenly():
    choice = choose(rate_per_h=1.0, delta_s=20, remaining_s=1200)

    # τ = 379 s: 1200 s is 3.16 of them, and three intervals of 400 s cost less than four.
    assert (choice.intervals_left, choice.interval_s) == (3, 400)
    assert "the 20 min from the last checkpoint to the end split in 3" in choice.why


def test_a_long_rest_on_a_sound_host_still_saves_every_six_hours():
    # MTBF 1000 h, δ 60 s: τ ≈ 18.6 h, so 8.5 h would be one piece; the 6 h clamp makes two.
    choice = choose(rate_per_h=0.001, delta_s=60, remaining_s=8.5 * 3600)

    assert (choice.intervals_left, choice.interval_s) == (2, 8.5 * 3600 / 2)


def test_no_checkpoint_is_asked_when_none_pays_before_the_end():
    choice = choose(rate_per_h=1.0, delta_s=20, remaining_s=240)

    assert math.isinf(choice.interval_s)
    assert choice.as_dict()["interval_s"] is None
    assert "no checkpoint pays before the end" in choice.why
    due = ci.next_action(
        now=NOW + timedelta(days=1),
        interval_s=choice.interval_s,
        last_ready_at=NOW,
        asked_at=None,
        uploading_since_ask=False,
        announced_since_ask=False,
        ignored_after=60,
    )
    assert due == ci.WAIT


def test_a_request_is_ignored_after_three_deltas_or_four_heartbeats():
    assert ci.ignored_after_s(100, 15) == 300
    assert ci.ignored_after_s(5, 15) == 60
    assert ci.ignored_after_s(5, 15, seconds_per_step=4) == 64


def action(**fields) -> str:
    defaults = {
        "now": NOW,
        "interval_s": 600,
        "last_ready_at": NOW - timedelta(seconds=300),
        "asked_at": None,
        "uploading_since_ask": False,
        "announced_since_ask": False,
        "ignored_after": 120,
    }
    return ci.next_action(**{**defaults, **fields})


def test_it_waits_until_the_interval_has_passed_since_the_last_ready_checkpoint():
    assert action() == ci.WAIT
    assert action(last_ready_at=NOW - timedelta(seconds=600)) == ci.ASK


def test_it_does_not_ask_again_while_a_request_is_pending():
    asked = NOW - timedelta(seconds=60)

    assert action(last_ready_at=NOW - timedelta(hours=1), asked_at=asked) == ci.WAIT


def test_an_unanswered_request_is_ignored_after_its_grace():
    asked = NOW - timedelta(seconds=120)

    assert action(last_ready_at=NOW - timedelta(hours=1), asked_at=asked) == ci.IGNORED


def test_a_checkpoint_uploading_since_the_request_is_an_answer():
    asked = NOW - timedelta(seconds=500)
    pending = {"last_ready_at": NOW - timedelta(hours=1), "asked_at": asked}

    assert action(**pending, uploading_since_ask=True, announced_since_ask=True) == ci.WAIT


def test_a_request_answered_by_a_failed_upload_is_asked_again():
    asked = NOW - timedelta(seconds=500)
    pending = {"last_ready_at": NOW - timedelta(hours=1), "asked_at": asked}

    assert action(**pending, announced_since_ask=True) == ci.ASK


def test_a_ready_checkpoint_after_the_request_starts_the_interval_again():
    asked = NOW - timedelta(seconds=500)

    assert action(last_ready_at=NOW - timedelta(seconds=400), asked_at=asked) == ci.WAIT
