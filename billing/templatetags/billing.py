"""``{% budget_banner as banner %}``: the spending-limit banner of the current team
(``billing.banner``: each limit's share now, polled while limits apply)."""

from __future__ import annotations

from django import template
from django.utils import timezone

from billing.banner import Banner, banner_for

register = template.Library()


@register.simple_tag(takes_context=True)
def budget_banner(context) -> Banner:
    """The banner for the context's ``current_team`` as its ``user`` sees it; empty for users
    without a team."""
    return banner_for(context.get("current_team"), now=timezone.now(), user=context.get("user"))
