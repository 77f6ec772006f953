from __future__ import annotations

from django import template

from nomadgpu.humanize import duration

register = template.Library()
register.filter("duration", duration)
