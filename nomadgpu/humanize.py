"""How numbers read to people, the same on every page, message and feed.

``nomadgpu_cli.cli.duration`` keeps a copy of ``duration`` (the CLI installs without the
server); ``tests/test_humanize.py`` holds the two to the same texts.
"""

from __future__ import annotations


def duration(seconds: float | None, none: str = "—") -> str:
    """Seconds as people say them: "45 s", "1 min 30 s" (under ten minutes the seconds still
    matter: a recovery's downtime), "12 min", "1 h", "2 h 05 min"; NONE when unknown.
    Minutes round half up, so 12 min 30 s reads "13 min"."""
    if seconds is None:
        return none
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def money(usd: float, *, per_hour: bool = False) -> str:
    """Dollars: "$0.19", "-$0.05"; prices per hour with three decimals, "$0.350/h"."""
    sign = "-" if usd < 0 else ""
    return f"{sign}${abs(usd):.3f}/h" if per_hour else f"{sign}${abs(usd):.2f}"
