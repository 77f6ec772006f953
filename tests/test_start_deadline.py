"""Start deadlines from bytes and the link (``jobs.watchdog.start_deadline``), as plain
decisions: when a host must have its agent, how what Vast shows pushes that, the user's cap,
and when an early phase of the agent stalls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.watchdog import start_deadline as sd

RENT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GIB = 1024**3


def plan(
    *, gb: float = 3.0, held: bool = False, mbps: float | None = 500.0, source: str = "advertised",
    cap_s: float = 86_400.0,
) -> sd.StartPlan:  # fmt: skip
    return sd.StartPlan(
        rented_at=RENT,
        image_gb=gb,
        image_held=held,
        link=sd.Link(mbps, source),
        start_timeout_s=cap_s,
    )


def seconds_after_rent(due: sd.Due) -> float:
    return (due.at - RENT).total_seconds()


def pull_s(gb: float, mbps: float) -> float:
    return gb * GIB * 8 / (mbps * 1e6)


# ---- before the agent ----------------------------------------------------------------------


def test_a_cached_image_is_given_vasts_start_and_the_agents_only():
    due = sd.start_due(plan(held=True))

    assert seconds_after_rent(due) == sd.VAST_START_S + sd.AGENT_START_S == 360
    assert due.why.startswith("image on the machine + Vast's start ≤ 300 s")
    assert "pull" not in due.why
    assert not due.capped


def test_an_uncached_image_adds_its_pull_at_the_advertised_link_times_three():
    due = sd.start_due(plan(gb=3.0, mbps=500.0))

    pull = pull_s(3.0, 500.0) * sd.ADVERTISED_MARGIN  # 51.5 s of bytes, 155 s allowed
    assert seconds_after_rent(due) == pytest.approx(300 + pull + 60)
    assert round(seconds_after_rent(due)) == 515
    assert "pull of 3.0 GB at 500 Mbit/s advertised: 155 s" in due.why


def test_a_measured_link_is_trusted_with_a_smaller_margin():
    due = sd.start_due(plan(gb=3.0, mbps=500.0, source="measured"))

    assert seconds_after_rent(due) == pytest.approx(300 + pull_s(3.0, 500.0) * 1.5 + 60)
    assert "500 Mbit/s measured" in due.why


def test_a_big_pull_on_a_slow_link_gets_its_hour():
    due = sd.start_due(plan(gb=15.0, mbps=100.0))

    assert round(seconds_after_rent(due)) == 4225  # 1,288 s of bytes x 3, + 360
    assert "pull of 15.0 GB at 100 Mbit/s advertised: 3865 s" in due.why


def test_the_users_start_timeout_is_the_outer_cap():
    due = sd.start_due(plan(gb=15.0, mbps=100.0, cap_s=1200))

    assert seconds_after_rent(due) == 1200
    assert due.capped
    assert due.why == (
        "the job's start timeout (1200 s), under Vast's start ≤ 300 s + pull of 15.0 GB at "
        "100 Mbit/s advertised: 3865 s + agent start 60 s = 4225 s"
    )


def test_without_a_link_to_time_the_pull_only_the_cap_is_safe():
    # An instance adopted by its label has no offer, so no advertised link.
    due = sd.start_due(plan(gb=3.0, mbps=None, cap_s=1200))

    assert seconds_after_rent(due) == 1200
    assert due.capped


def test_which_link_is_planned_with():
    assert sd.link_for(80.0, 500.0) == sd.Link(80.0, "measured")
    assert sd.link_for(None, 500.0) == sd.Link(500.0, "advertised")
    assert sd.link_for(0, None) == sd.Link(None)
    assert sd.Link(None).seconds(10 * GIB) == 0.0  # unknown link: Vast's start alone


def news(before: str, now: str, before_msg: str = "", now_msg: str = "", **kw) -> sd.ProviderNews:
    return sd.ProviderNews(before, before_msg, now, now_msg, **kw)


def test_loading_first_seen_gives_the_pull_from_then():
    p = plan(gb=3.0, mbps=500.0)
    due = sd.start_due(p)
    late = RENT + timedelta(seconds=400)  # scheduled late, still inside Vast's 2-5 min

    pushed = sd.pushed_start_due(p, due, news("created", "loading"), now=late)

    assert seconds_after_rent(pushed) == pytest.approx(400 + pull_s(3.0, 500.0) * 3 + 30 + 60)
    assert pushed.why.startswith("loading seen: pull of 3.0 GB")


def test_news_never_pulls_a_deadline_earlier():
    p = plan(gb=3.0, mbps=500.0)
    due = sd.start_due(p)
    early = RENT + timedelta(seconds=20)

    assert sd.pushed_start_due(p, due, news("created", "loading"), now=early) is None
    assert sd.pushed_start_due(p, due, news("loading", "running"), now=early) is None


def test_running_seen_gives_the_agent_its_start_from_then():
    p = plan(held=True)
    due = sd.start_due(p)

    pushed = sd.pushed_start_due(
        p, due, news("loading", "running"), now=RENT + timedelta(seconds=330)
    )

    assert seconds_after_rent(pushed) == 330 + 60
    assert pushed.why == "running seen: agent start"


def test_a_pull_that_moves_pushes_the_deadline_and_a_frozen_one_does_not():
    p = plan(gb=3.0, mbps=500.0)
    due = sd.start_due(p)
    at = RENT + timedelta(seconds=500)
    moving = news("loading", "loading", "a1b2: Downloading 1.1GB/3.6GB", "a1b2: Extracting 12MB")

    pushed = sd.pushed_start_due(p, due, moving, now=at)
    frozen = news("loading", "loading", "a1b2: Downloading 1.1GB/3.6GB", moving.before_msg)

    assert seconds_after_rent(pushed) == 500 + sd.PULL_QUIET_S + 30 + 60
    assert "pull moving (“a1b2: Extracting 12MB”)" in pushed.why
    assert sd.pushed_start_due(p, due, frozen, now=at) is None


def test_the_first_pull_line_is_the_pull_starting_not_bytes_moving():
    p = plan(gb=3.0, mbps=500.0)
    due = sd.start_due(p)
    first_line = news("loading", "loading", "", "a1b2: Downloading 1.1GB/3.6GB")

    assert first_line.pull_started
    assert not first_line.pull_moving
    assert sd.pushed_start_due(p, due, first_line, now=RENT + timedelta(seconds=510)) is None


def test_a_retry_countdown_is_not_progress():
    p = plan(gb=3.0, mbps=500.0)
    due = sd.start_due(p)
    retrying = news(
        "loading", "loading", "0d30: Retrying in 5 seconds", "0d30: Retrying in 4 seconds"
    )

    assert not retrying.pull_moving
    assert sd.pushed_start_due(p, due, retrying, now=RENT + timedelta(seconds=510)) is None


def test_a_pull_on_a_machine_taken_to_hold_the_image_gets_the_whole_pull_from_then():
    p = plan(gb=15.0, mbps=1000.0, held=True)
    due = sd.start_due(p)  # 360 s: no pull
    pulling = news("loading", "loading", "", "9f86: Pulling fs layer")
    at = RENT + timedelta(seconds=60)

    pushed = sd.pushed_start_due(p, due, pulling, now=at)

    assert seconds_after_rent(pushed) == pytest.approx(60 + pull_s(15.0, 1000.0) * 3 + 90)
    assert sd.pull_seen_on_held_image(p, pulling)
    # Remembered: the next status change allows the pull too.
    seen = news("created", "loading", pull_seen=True)
    later = sd.pushed_start_due(p, pushed, seen, now=RENT + timedelta(seconds=200))
    assert seconds_after_rent(later) == pytest.approx(200 + pull_s(15.0, 1000.0) * 3 + 90)


def test_pushes_stop_at_the_users_cap():
    p = plan(gb=3.0, mbps=500.0, cap_s=600)
    due = sd.start_due(p)
    moving = news("loading", "loading", "x: Downloading 1MB/2GB", "x: Downloading 9MB/2GB")

    pushed = sd.pushed_start_due(p, due, moving, now=RENT + timedelta(seconds=510))

    assert seconds_after_rent(pushed) == 600
    assert pushed.capped
    # Once at the cap, nothing pushes it further.
    assert sd.pushed_start_due(p, pushed, moving, now=RENT + timedelta(seconds=590)) is None


def test_an_overdue_host_is_described_with_its_deadline():
    due = sd.start_due(plan(gb=3.0, mbps=500.0))
    now = RENT + timedelta(seconds=530)

    detail = sd.overdue_detail(due, rented_at=RENT, provider_status="loading", now=now)
    running = sd.overdue_detail(due, rented_at=RENT, provider_status="running", now=now)

    assert detail.startswith("not running 530 s after rent: Vast's start ≤ 300 s + pull of 3.0 GB")
    assert detail.endswith("due by 515 s")
    assert running.startswith("running but no agent 530 s after rent")
