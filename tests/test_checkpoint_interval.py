"""The Young/Daly interval as plain decisions: the formula, its clamps, λ and δ, when to ask."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from hosts import selection
from jobs import checkpoint_interval as ci

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def choose(rate_per_h: float, delta_s: float, heartbeat_s: float = 15.0) -> ci.IntervalChoice:
    return ci.choose_interval(
        rate_per_h=rate_per_h,
        rate_source="prior",
        delta_s=delta_s,
        delta_source="measured",
        heartbeat_s=heartbeat_s,
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


def test_delta_is_the_median_of_measured_uploads():
    assert ci.checkpoint_cost_s([10.0, 40.0, 20.0]) == (20.0, "median of 3 uploads")


def test_delta_is_the_default_until_an_upload_is_measured():
    assert ci.checkpoint_cost_s([]) == (ci.DEFAULT_DELTA_S, "default until measured")


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
