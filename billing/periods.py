"""Calendar periods of the team limits, in the team's time zone.

A period runs from local midnight to local midnight: a day, a week from Monday, a month from
the 1st. Bounds are computed as local wall-clock midnights and converted to UTC with zoneinfo,
so a day across a DST change is 23 or 25 hours long and a week holding one is 167 or 169.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)


def _next_month(day: date) -> date:
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def period_bounds(kind: str, now: datetime, time_zone: str) -> tuple[datetime, datetime]:
    """The UTC bounds [start, end) of the calendar period KIND ("day", "week", "month",
    "member_month") holding NOW in TIME_ZONE. Weeks start on Monday."""
    tz = ZoneInfo(time_zone)
    today = now.astimezone(tz).date()
    if kind == "day":
        first, after = today, today + timedelta(days=1)
    elif kind == "week":
        first = today - timedelta(days=today.weekday())
        after = first + timedelta(days=7)
    elif kind in ("month", "member_month"):
        first = today.replace(day=1)
        after = _next_month(first)
    else:
        raise ValueError(f"no calendar period {kind!r}")
    return _local_midnight(first, tz), _local_midnight(after, tz)
