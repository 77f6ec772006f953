"""hosts.wait_or_move on plain numbers: wait for a host that went offline, or move the job.

No server and no database. The field report's shape moves in about 5.5 min (a 4 GB image and
a 15 GB model at 500 Mbit/s, a rent, a restore); a restart on the same disk takes seconds.
"""

from __future__ import annotations

import pytest

from hosts.wait_or_move import (
    MIN_RETURN_P,
    PRIOR_RETURN_MEAN_S,
    PRIOR_RETURN_P,
    ReturnHistory,
    back_within,
    odds_after,
    wait_or_move,
)

FIELD_REPORT_MOVE = {"move_h": 5.5 / 60, "move_usd": 0.03}
RESTART = {"restart_h": 10 / 3600, "restart_usd": 0.001}
QUICK_RETURNER = ReturnHistory(returns=8, return_s=8 * 40.0)  # back within a minute, always


def choice(**changes):
    numbers = {
        "offline_s": 0.0,
        "cap_s": 600.0,
        "history": QUICK_RETURNER,
        **RESTART,
        **FIELD_REPORT_MOVE,
        "usd_per_hour": 0.35,
    }
    return wait_or_move(**{**numbers, **changes})


def test_it_waits_when_the_machine_comes_back_quickly_and_moving_is_costly():
    decided = choice()
    assert decided.wait
    assert decided.wait_usd < decided.move_usd
    assert decided.wait_h < decided.move_h
    assert decided.return_p > 0.7
    assert "wait up to 600 s" in decided.why
    assert "came back 8 of 8 times" in decided.why


def test_it_moves_when_moving_is_quick_even_for_a_machine_that_comes_back():
    decided = choice(move_h=20 / 3600, move_usd=0.001)
    assert not decided.wait
    assert decided.why.startswith("move:")


def test_it_moves_when_the_machine_rarely_comes_back():
    rarely = ReturnHistory(returns=1, return_s=40.0, never=9)
    decided = choice(history=rarely)
    assert not decided.wait
    assert decided.return_p < 0.3


def test_it_moves_once_the_cap_has_passed():
    decided = choice(offline_s=600.0)
    assert not decided.wait
    assert decided.return_p == 0.0
    assert "deadline for waiting passed" in decided.why


def test_the_odds_fall_while_the_host_stays_away_until_it_moves_before_the_cap():
    early = choice(offline_s=30.0)
    late = choice(offline_s=400.0)
    assert early.wait
    assert late.return_p < early.return_p
    assert not late.wait  # ten mean return times away: it is not coming back
    assert late.deadline_s > 0


def test_the_prior_moves_the_field_report_job_without_history():
    # Half the hosts back in 5 min on average: waiting pays only once a machine has shown
    # it comes back fast.
    decided = choice(history=ReturnHistory())
    assert not decided.wait
    assert "the prior" in decided.why


def test_history_is_blended_with_the_prior():
    assert ReturnHistory().probability == pytest.approx(PRIOR_RETURN_P)
    assert ReturnHistory().mean_s == pytest.approx(PRIOR_RETURN_MEAN_S)
    history = ReturnHistory(returns=2, return_s=20.0)
    assert history.probability == pytest.approx((2 + PRIOR_RETURN_P * 2) / 4)
    assert history.mean_s == pytest.approx((20 + PRIOR_RETURN_MEAN_S * 2) / 4)


def test_being_away_longer_lowers_the_odds_it_comes_back_at_all():
    assert odds_after(0.8, 60.0, 0.0) == pytest.approx(0.8)
    assert odds_after(0.8, 60.0, 60.0) < 0.8
    assert odds_after(0.8, 60.0, 6000.0) < MIN_RETURN_P


def test_the_truncated_mean_is_under_both_the_window_and_the_mean():
    inside, mean = back_within(60.0, 120.0)
    assert inside == pytest.approx(1 - 2.718281828**-2, rel=1e-6)
    assert 0 < mean < 60.0
    assert back_within(60.0, 0.0) == (0.0, 0.0)


def test_its_numbers_are_json_ready():
    data = choice().as_dict()
    assert data["wait"] is True
    assert set(data) >= {"wait_usd", "move_usd", "return_p", "deadline_s"}
