"""Formatting for the finance pages: dollars (the one money rule), signed differences,
percentages, statuses.

A difference's percentage (``difference``) is of the recorded amount as written, like every
percentage beside amounts (``nomadgpu.humanize``), and it is shown only where it means
something: not for a row not billed yet (its invoice is not complete: "-100 %" would only say
that), and not of a recorded amount that rounds to $0.00.
"""

from __future__ import annotations

from django import template

from billing.reconcile import Status
from nomadgpu.humanize import money, money_value

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


NOT_BILLED_YET = "not billed yet"


def difference_text(recorded, billed, *, pending: int = 0) -> str:
    """Billed minus RECORDED as the finance pages write it: "+$0.0120 (+3.2 %)"; with PENDING
    attempts (live, or ended after the last import) "not billed yet" while nothing was billed,
    else the difference and why no percentage ("— %, 1 attempt not billed yet"); "— %,
    nothing recorded" when the recorded amount rounds to $0.00."""
    recorded, billed = float(recorded or 0), float(billed or 0)
    if pending and not money_value(billed):
        return NOT_BILLED_YET
    text = signed_usd(billed - recorded)
    if pending:
        return f"{text} (— %, {pending} attempt{'s' if pending != 1 else ''} not billed yet)"
    shown = money_value(recorded)
    if not shown:
        return f"{text} (— %, nothing recorded)"
    return f"{text} ({float((money_value(billed) - shown) / shown * 100):+.1f} %)"


@register.filter
def difference(row, pending=0) -> str:
    """``difference_text`` of ROW (anything with ``recorded`` and ``billed``), PENDING of its
    attempts not billed yet."""
    return difference_text(row.recorded, row.billed, pending=int(pending or 0))


@register.filter
def status_label(value: str) -> str:
    return Status.LABELS.get(value, value)


@register.filter
def qty(value) -> str:
    return "-" if value is None else f"{float(value):.3f}"
