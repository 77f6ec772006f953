"""Formatting for the finance pages: dollars, signed differences, percentages, statuses."""

from __future__ import annotations

from django import template

from billing.reconcile import Status

register = template.Library()


@register.filter
def usd(value) -> str:
    """$1.23, -$0.05; four decimals under a dollar (sandbox and short runs bill cents)."""
    if value is None:
        return "-"
    amount = float(value)
    digits = 2 if abs(amount) >= 1 else 4
    amount = round(amount, digits) or 0.0  # no "-$0.0000"
    return f"{'-' if amount < 0 else ''}${abs(amount):,.{digits}f}"


@register.filter
def signed_usd(value) -> str:
    text = usd(float(value or 0))
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
