"""Formatting for the finance pages: dollars (the one money rule), signed differences,
percentages, statuses."""

from __future__ import annotations

from django import template

from billing.reconcile import Status
from nomadgpu.humanize import money

register = template.Library()


@register.filter
def usd(value) -> str:
    """Dollars by the one money rule (``nomadgpu.humanize.money``): "$1.23", "$0.0177"; "-"
    for none."""
    return "-" if value is None else money(value)


@register.filter
def signed_usd(value) -> str:
    """A difference with its sign: "+$0.0120", "-$0.0500", "$0.00"."""
    text = usd(value or 0)
    return text if text.startswith("-") or not text.strip("$0.,") else "+" + text


@register.filter
def pct(value) -> str:
    """(+3.2 %) after a difference; nothing when there is no recorded amount to divide by."""
    return "" if value is None else f" ({float(value):+.1f} %)"


@register.filter
def status_label(value: str) -> str:
    return Status.LABELS.get(value, value)


@register.filter
def qty(value) -> str:
    return "-" if value is None else f"{float(value):.3f}"
