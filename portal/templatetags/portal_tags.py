from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as "45 s", "12 min", "2 h 05 min" (an ETA reads better rounded like this)."""
    if seconds is None:
        return "—"
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    hours, rest = divmod(s, 3600)
    return f"{hours} h {rest // 60:02d} min"
