"""When an early phase of the agent stalls (``jobs.watchdog.phase_stall``), as plain decisions:
the bytes left at the link measured on the host (else advertised) times a margin, at least a
minute; slow but moving is never a stall; what the link measure keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.watchdog import phase_stall as ps
from jobs.watchdog import start_deadline as sd

RENT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GIB = 1024**3


def pull_s(gb: float, mbps: float) -> float:
    return gb * GIB * 8 / (mbps * 1e6)


MB = 1024**2


def report(**phases) -> dict:
    return {
        name: {"bytes_done": done, "bytes_total": total, "done": finished}
        for name, (done, total, finished) in phases.items()
    }


def at(seconds: float) -> datetime:
    return RENT + timedelta(seconds=seconds)


def test_a_restore_that_stops_moving_stalls_after_the_bytes_left_allow_at_least_a_minute():
    progress = ps.next_progress(None, report(restore=(0, 600 * MB, False)), now=at(0))
    progress = ps.next_progress(progress, report(restore=(290 * MB, 600 * MB, False)), now=at(29))
    progress = ps.next_progress(progress, report(restore=(290 * MB, 600 * MB, False)), now=at(44))

    link = sd.link_for(progress.measured_mbps, 1000.0)
    due = ps.phase_due(progress, link, interval_s=15)

    assert link.source == "measured"
    assert progress.measured_mbps == pytest.approx(290 * MB * 8 / 29 / 1e6)  # ~84 Mbit/s
    assert due.at == at(29) + timedelta(seconds=60)  # 310 MB at 84 Mbit/s x 1.5 is 46 s: floor
    assert due.why.startswith("restore: 310 MB left at 84 Mbit/s measured")
    detail = ps.stall_detail(progress, link, now=at(90))
    assert detail == "stalled in restore: 0 bytes in 61 s, 310 MB left at 84 Mbit/s measured"


def test_a_big_download_left_on_a_slow_link_is_given_its_time():
    progress = ps.next_progress(None, report(stage=(0, 15 * GIB, False)), now=at(0))

    due = ps.phase_due(progress, sd.Link(100.0, "advertised"), interval_s=15)

    assert (due.at - at(0)).total_seconds() == pytest.approx(pull_s(15, 100) * 3)


def test_the_phases_under_way_share_the_link():
    both = report(stage=(0, 1 * GIB, False), restore=(0, 1 * GIB, False))
    progress = ps.next_progress(None, both, now=at(0))

    due = ps.phase_due(progress, sd.Link(100.0, "advertised"), interval_s=1)

    assert (due.at - at(0)).total_seconds() == pytest.approx(pull_s(2, 100) * 3)
    assert "2.0 GB left" in due.why


def test_bytes_that_move_push_the_phases_deadline():
    first = ps.next_progress(None, report(code=(0, 50 * MB, False)), now=at(0))
    moved = ps.next_progress(first, report(code=(10 * MB, 50 * MB, False)), now=at(50))

    link = sd.Link(100.0, "advertised")
    assert ps.phase_due(moved, link, interval_s=1).at == at(50) + timedelta(seconds=60)


def test_a_heartbeat_interval_longer_than_a_quarter_minute_widens_the_floor():
    progress = ps.next_progress(None, report(restore=(0, MB, False)), now=at(0))

    due = ps.phase_due(progress, sd.Link(1000.0, "advertised"), interval_s=30)

    assert due.at == at(0) + timedelta(seconds=ps.PHASE_FLOOR_BEATS * 30)


def test_phases_without_a_total_or_ended_never_stall():
    progress = ps.next_progress(
        None,
        report(setup=(5 * MB, None, False), code=(50 * MB, 50 * MB, True)),
        now=at(0),
    )

    assert ps.phase_due(progress, sd.Link(100.0, "advertised"), interval_s=1) is None


def test_a_restarted_agent_counting_from_zero_is_progress_and_measures_again():
    progress = ps.next_progress(None, report(restore=(0, 900 * MB, False)), now=at(0))
    progress = ps.next_progress(progress, report(restore=(400 * MB, 900 * MB, False)), now=at(10))

    again = ps.next_progress(progress, report(restore=(0, 900 * MB, False)), now=at(300))

    assert again.phases["restore"].progress_at == at(300)
    assert again.first_at == again.moved_at == at(300)
    assert again.measured_mbps is None


def test_a_stall_does_not_lower_the_measured_link():
    progress = ps.next_progress(None, report(restore=(0, 900 * MB, False)), now=at(0))
    progress = ps.next_progress(progress, report(restore=(400 * MB, 900 * MB, False)), now=at(10))
    still = ps.next_progress(progress, report(restore=(400 * MB, 900 * MB, False)), now=at(500))

    assert still.measured_mbps == progress.measured_mbps == pytest.approx(400 * MB * 8 / 10 / 1e6)


def test_stored_progress_reads_back_and_a_broken_row_reads_as_none():
    progress = ps.next_progress(
        None, report(restore=(7, 9, False), setup=(3, None, True)), now=at(0)
    )

    assert ps.EarlyProgress.from_json(progress.as_json()) == progress
    assert ps.EarlyProgress.from_json({"phases": "?"}) is None
    assert ps.EarlyProgress.from_json(None) is None
