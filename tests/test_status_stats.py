"""statuspage.stats.team_status against hand-computed sets: the field report's 30 days, the
7/30/90-day window boundaries, and calendar days in the team's time zone (DST included)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from jobs.models import Interruption
from statuspage.stats import nearest_rank, team_status
from tests.support.factories import InterruptionFactory, JobFactory, TeamFactory, make_attempt

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

# The field report's month: 15 interruptions, 12 resumed, 3 cancelled before the replacement
# came up. Seconds from the loss (the last heartbeat) until the replacement was running, for
# the 12 resumed ones ("back on a machine", jobs.recovery_times):
BACK_S = [35, 42, 50, 55, 58, 60, 65, 70, 90, 180, 480, 600]
# Nearest rank over 12 sorted values: median = rank ceil(6) = 6th = 60 s (the report's
# "about one minute"); p90 = rank ceil(10.8) = 11th = 480 s (its "about eight minutes").
FIRST_STEP_S = 30  # each replacement then took 30 s to its first step: "training again"
# Last heartbeat → detection for 13 of them; the other two never heartbeated (never_registered).
DETECT_S = [20, 25, 28, 30, 30, 31, 32, 33, 35, 40, 45, 60, 90]
# Over 13 values: median = rank ceil(6.5) = 7th = 32 s; p90 = rank ceil(11.7) = 12th = 60 s.


def interrupt(job, number: int, detected_at: datetime, **fields) -> Interruption:
    attempt, _ = make_attempt(job, number=number, state="ended")
    fields.setdefault("cause", "heartbeat_timeout")
    return InterruptionFactory(attempt=attempt, detected_at=detected_at, **fields)


def field_report_month(team) -> None:
    """15 interruptions two days apart (all within 30 days); the first 12 resumed."""
    job = JobFactory(team=team)
    for k in range(15):
        detected = NOW - timedelta(days=2 * k, hours=1)
        fields: dict = {"cause": "provider_gone"}
        if k < len(DETECT_S):
            fields["last_heartbeat_at"] = detected - timedelta(seconds=DETECT_S[k])
        else:
            fields["cause"] = "never_registered"
        if k < len(BACK_S):
            back = fields["last_heartbeat_at"] + timedelta(seconds=BACK_S[k])
            fields |= {
                "replacement_rented_at": detected + timedelta(seconds=3),
                "running_again_at": back,
                "training_again_at": back + timedelta(seconds=FIRST_STEP_S),
                "resumed_step": 50 * k,
            }
        else:
            fields["cancelled_before_recovery"] = True
        interrupt(job, k + 1, detected, **fields)


@pytest.fixture
def berlin(db):
    return TeamFactory(slug="berlin", time_zone="Europe/Berlin", public_status_page=True)


def test_the_field_reports_month_gives_its_published_numbers(berlin):
    field_report_month(berlin)
    other_team_job = JobFactory(team=TeamFactory(slug="elsewhere"))
    interrupt(other_team_job, 1, NOW - timedelta(hours=2), replacement_rented_at=NOW)

    status = team_status(berlin, now=NOW, days=30)

    assert status.interruptions == 15
    assert status.resumed == 12
    assert status.cancelled_before_recovery == 3
    assert status.recovering == 0
    assert status.back_on_machine.count == 12
    assert status.back_on_machine.median_s == 60
    assert status.back_on_machine.p90_s == 480
    assert status.training_again.count == 12
    assert status.training_again.median_s == 60 + FIRST_STEP_S
    assert status.training_again.p90_s == 480 + FIRST_STEP_S
    assert status.detection.count == 13
    assert status.detection.median_s == 32
    assert status.detection.p90_s == 60


def test_daily_bars_cover_every_day_of_the_window_and_add_up(berlin):
    field_report_month(berlin)

    status = team_status(berlin, now=NOW, days=30)

    assert len(status.daily) == 30
    assert status.daily[0].day == date(2026, 10, 31)
    assert status.daily[-1].day == date(2026, 11, 29)
    assert sum(d.interruptions for d in status.daily) == 15
    busy = {d.day for d in status.daily if d.interruptions}
    assert busy == {date(2026, 11, 29) - timedelta(days=2 * k) for k in range(15)}


def test_incident_history_is_newest_first_with_outcome_and_resumed_step(berlin):
    field_report_month(berlin)

    incidents = team_status(berlin, now=NOW, days=30).incidents

    assert len(incidents) == 15
    newest, oldest = incidents[0], incidents[-1]
    assert newest.detected_at == NOW - timedelta(hours=1)
    assert str(newest.detected_at.tzinfo) == "Europe/Berlin"
    assert newest.lost_at == newest.detected_at - timedelta(seconds=20)  # its last heartbeat
    assert newest.back_on_machine_at == newest.lost_at + timedelta(seconds=35)
    assert (newest.back_on_machine_s, newest.training_again_s) == (35, 35 + FIRST_STEP_S)
    assert (newest.outcome, newest.resumed_step) == ("resumed", 0)
    assert incidents[3].resumed_step == 150
    assert (oldest.outcome, oldest.cause, oldest.resumed_step) == (
        "cancelled",
        "never_registered",
        None,
    )
    assert oldest.cause_label == "agent never started"
    assert len({i.ref for i in incidents}) == 15


def test_an_interruption_still_open_counts_as_recovering(berlin):
    interrupt(JobFactory(team=berlin), 1, NOW - timedelta(minutes=3))

    status = team_status(berlin, now=NOW, days=7)

    assert (status.interruptions, status.resumed, status.recovering) == (1, 0, 1)
    assert status.back_on_machine.count == 0
    assert status.back_on_machine.median_s is None
    assert status.incidents[0].outcome == "recovering"


def test_windows_are_whole_calendar_days_ending_today(db):
    team = TeamFactory(slug="utc-team", time_zone="UTC")
    job = JobFactory(team=team)
    moments = [
        datetime(2026, 11, 23, 0, 0, 0, tzinfo=UTC),  # first instant of the 7-day window
        datetime(2026, 11, 22, 23, 59, 59, tzinfo=UTC),  # one second before it
        datetime(2026, 10, 31, 0, 0, 0, tzinfo=UTC),  # first instant of the 30-day window
        datetime(2026, 10, 30, 23, 59, 59, tzinfo=UTC),
        datetime(2026, 9, 1, 0, 0, 0, tzinfo=UTC),  # first instant of the 90-day window
        datetime(2026, 8, 31, 23, 59, 59, tzinfo=UTC),  # in none
        NOW + timedelta(seconds=1),  # not yet happened at NOW
    ]
    for number, moment in enumerate(moments, start=1):
        interrupt(job, number, moment)

    counts = {days: team_status(team, now=NOW, days=days) for days in (7, 30, 90)}

    assert {d: s.interruptions for d, s in counts.items()} == {7: 1, 30: 3, 90: 5}
    assert {d: len(s.daily) for d, s in counts.items()} == {7: 7, 30: 30, 90: 90}
    assert counts[90].since == datetime(2026, 9, 1, tzinfo=UTC)


def test_it_refuses_a_window_it_does_not_publish(db):
    with pytest.raises(ValueError, match="days must be one of"):
        team_status(TeamFactory(), now=NOW, days=14)


def test_late_evening_utc_is_the_next_day_in_berlin(berlin):
    utc_team = TeamFactory(slug="utc-team", time_zone="UTC")
    late = datetime(2026, 11, 27, 23, 30, tzinfo=UTC)  # 00:30 on the 28th in Berlin (CET)
    interrupt(JobFactory(team=berlin), 1, late)
    interrupt(JobFactory(team=utc_team), 1, late)

    in_berlin = {d.day: d.interruptions for d in team_status(berlin, now=NOW, days=7).daily}
    in_utc = {d.day: d.interruptions for d in team_status(utc_team, now=NOW, days=7).daily}

    assert (in_berlin[date(2026, 11, 27)], in_berlin[date(2026, 11, 28)]) == (0, 1)
    assert (in_utc[date(2026, 11, 27)], in_utc[date(2026, 11, 28)]) == (1, 0)


@pytest.mark.parametrize(
    ("now", "moments", "expected"),
    [
        # Spring forward: 29 March 2026 in Berlin has 23 hours (CEST +2 from 01:00 UTC).
        (
            datetime(2026, 3, 30, 12, 0, tzinfo=UTC),
            [
                datetime(2026, 3, 28, 22, 30, tzinfo=UTC),  # 23:30 CET on the 28th
                datetime(2026, 3, 28, 23, 30, tzinfo=UTC),  # 00:30 CET on the 29th
                datetime(2026, 3, 29, 21, 30, tzinfo=UTC),  # 23:30 CEST on the 29th
                datetime(2026, 3, 29, 22, 30, tzinfo=UTC),  # 00:30 CEST on the 30th
            ],
            {date(2026, 3, 28): 1, date(2026, 3, 29): 2, date(2026, 3, 30): 1},
        ),
        # Fall back: 25 October 2026 in Berlin has 25 hours.
        (
            datetime(2026, 10, 27, 12, 0, tzinfo=UTC),
            [
                datetime(2026, 10, 24, 21, 59, tzinfo=UTC),  # 23:59 CEST on the 24th
                datetime(2026, 10, 24, 22, 0, tzinfo=UTC),  # 00:00 CEST on the 25th
                datetime(2026, 10, 25, 22, 59, tzinfo=UTC),  # 23:59 CET on the 25th
                datetime(2026, 10, 25, 23, 0, tzinfo=UTC),  # 00:00 CET on the 26th
            ],
            {date(2026, 10, 24): 1, date(2026, 10, 25): 2, date(2026, 10, 26): 1},
        ),
    ],
)
def test_days_around_a_dst_change_follow_the_local_calendar(berlin, now, moments, expected):
    job = JobFactory(team=berlin)
    for number, moment in enumerate(moments, start=1):
        interrupt(job, number, moment)

    daily = {d.day: d.interruptions for d in team_status(berlin, now=now, days=7).daily}

    assert {day: n for day, n in daily.items() if n} == expected


def test_a_window_across_a_dst_change_starts_at_local_midnight(berlin):
    now = datetime(2026, 3, 30, 12, 0, tzinfo=UTC)  # CEST; the window starts on the 24th (CET)
    job = JobFactory(team=berlin)
    interrupt(job, 1, datetime(2026, 3, 23, 23, 0, tzinfo=UTC))  # 00:00 CET on the 24th
    interrupt(job, 2, datetime(2026, 3, 23, 22, 59, 59, tzinfo=UTC))  # 23:59:59 on the 23rd

    status = team_status(berlin, now=now, days=7)

    assert status.since == datetime(2026, 3, 23, 23, 0, tzinfo=UTC)
    assert status.interruptions == 1
    assert status.daily[0].day == date(2026, 3, 24)


@pytest.mark.parametrize(
    ("values", "percent", "expected"),
    [
        ([], 50, None),
        ([7.0], 90, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.0),  # even count: the lower middle value
        (list(range(1, 11)), 90, 9),  # rank exactly 9: no float rounding up to 10
        (list(range(1, 21)), 90, 18),
        (list(range(1, 12)), 90, 10),  # rank ceil(9.9) = 10
    ],
)
def test_percentiles_are_nearest_rank(values, percent, expected):
    assert nearest_rank(values, percent) == expected
