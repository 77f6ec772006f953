"""The stall rule (``jobs.watchdog.stall.is_stalled``) as the heartbeat and the watchdog both
ask it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.watchdog.stall import is_stalled

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIMEOUT_S = 600


def stalled(**given) -> bool:
    """A running attempt at step 10, last progress at the stall timeout ago, a beat at step 10."""
    fields = {
        "phase": "running",
        "step_before": 10,
        "step_now": 10,
        "last_progress_at": NOW - timedelta(seconds=TIMEOUT_S),
        "running_at": NOW - timedelta(hours=1),
        "stall_timeout_s": TIMEOUT_S,
        "now": NOW,
    }
    return is_stalled(**{**fields, **given})


def test_the_same_step_for_the_stall_timeout_is_a_stall():
    assert stalled() is True


def test_the_same_step_for_less_than_the_stall_timeout_is_not():
    assert stalled(last_progress_at=NOW - timedelta(seconds=TIMEOUT_S - 1)) is False


def test_a_new_step_is_progress_however_long_the_last_one_took():
    assert stalled(step_now=11) is False


def test_a_first_step_is_progress():
    assert stalled(step_before=None, step_now=1, last_progress_at=None) is False


def test_a_step_lower_than_the_stored_one_is_no_progress():
    # A restarted script that starts over below its old step has not moved past it.
    assert stalled(step_now=9) is True


@pytest.mark.parametrize("phase", ["restoring", "uploading", "exiting", "starting"])
def test_phases_that_move_no_steps_never_stall(phase):
    assert stalled(phase=phase, last_progress_at=NOW - timedelta(days=1)) is False


def test_an_attempt_no_beat_has_described_yet_can_stall():
    # The watchdog's stored phase is "" until the first beat: nothing says it is busy otherwise.
    assert stalled(phase="") is True


def test_the_watchdog_asking_with_the_stored_step_alone_sees_a_stall():
    assert stalled(step_before=10, step_now=10) is True


def test_without_a_progress_time_it_counts_from_when_training_started():
    assert stalled(last_progress_at=None, running_at=NOW - timedelta(seconds=TIMEOUT_S)) is True
    assert stalled(last_progress_at=None, running_at=NOW - timedelta(seconds=60)) is False


def test_without_a_progress_time_or_a_start_nothing_stalls():
    assert stalled(last_progress_at=None, running_at=None) is False


def test_a_script_that_never_reported_a_step_never_stalls():
    assert stalled(step_before=None, step_now=None, last_progress_at=None) is False


def test_a_script_that_reported_steps_and_then_none_can_stall():
    # The watchdog's stored row: progress was seen once, and then nothing for the timeout.
    assert stalled(step_before=None, step_now=None) is True


def test_a_beat_without_a_step_after_steps_were_seen_is_not_judged():
    # An agent restarted in the same container (a raised bid) beats before it reads progress.
    assert stalled(step_before=150, step_now=None) is False
