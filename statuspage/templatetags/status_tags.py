from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as people read them: "45 s", "8 min", "1 h 5 min"; "no data" for None."""
    if seconds is None:
        return "no data"
    if seconds < 60:
        return f"{round(seconds)} s"
    minutes = int(seconds / 60 + 0.5)  # half up: 90 s reads "2 min", not banker's "2"/"1"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
