from __future__ import annotations

from collections.abc import Mapping

from django import template

from jobs.rent_decision import RentDecision
from nomadgpu.humanize import duration, instance_price, loss, money

register = template.Library()
register.filter("duration", duration)
register.filter("loss", loss)


@register.filter(name="money")
def money_filter(value) -> str:
    """An amount as every surface writes it (``humanize.money``); "-" where there is none (a
    stored decision older than the figure, say), as finance's ``usd`` writes it: a page must
    never fail on a missing number."""
    if value is None or value == "":
        return "-"
    return money(value)


@register.filter
def usd_per_hour(value: float | None) -> str:
    """A GPU price as every offers and rental table prints it (``humanize.money``'s $/h)."""
    return "—" if value is None else money(float(value), per_hour=True)


@register.filter
def instance_usd_per_hour(value: float | None, decision=None) -> str:
    """``usd_per_hour`` of the instance DECISION (a stored rent decision) chose, its per-GPU
    price beside it for several GPUs (``humanize.instance_price``: "$1.60/h (4 x $0.400)");
    a decision that names no count reads as one GPU."""
    if value is None:
        return "—"
    count = RentDecision(decision if isinstance(decision, Mapping) else {}).chosen_offer.get(
        "num_gpus"
    )
    return instance_price(float(value), count if isinstance(count, int) else 1)
