"""``{% budget_banner_items %}``: the budget warnings and pauses the portal banner shows."""

from __future__ import annotations

from django import template
from django.db.models import Q
from django.utils import timezone

from billing.models import BudgetWarning
from jobs.models import Job, JobState

register = template.Library()


@register.simple_tag(takes_context=True)
def budget_banner_items(context) -> list[str]:
    """Lines for the current team: limits past 80 % in their current period, jobs paused by a
    limit. Empty for anonymous users and users without a team."""
    team = context.get("current_team")
    if team is None:
        return []
    now = timezone.now()
    warnings = BudgetWarning.objects.filter(team=team).filter(
        Q(period_end__gt=now) | Q(period_end=None, job__state__in=["running", "starting"])
    )
    lines = [
        f"{w.get_limit_display().capitalize()} limit ${w.limit_usd}: 80 % reached"
        + (f" by job {w.job}" if w.job_id else "")
        + (f" by {w.user}" if w.user_id else "")
        for w in warnings.select_related("job", "user")[:5]
    ]
    paused = Job.objects.filter(team=team, state=JobState.PAUSED_BUDGET).count()
    if paused:
        lines.append(f"{paused} job(s) paused by a spending limit")
    return lines
