from __future__ import annotations

from django import template

from nomadgpu.humanize import duration, money

register = template.Library()
# The status page's own name for the one rule (``{{ p90|duration:"no data" }}``).
register.filter("duration", duration)
register.filter("money", money)
