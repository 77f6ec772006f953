"""The spending-limit banner at the top of every portal page: where each of the team's limits
stands now, not where it stood when its 80 % warning was written.

The banner is measured on each render, from the same limits enforcement checks
(``billing.enforce.statuses_to_check``: the team's periods, the members with active jobs,
the active jobs' own limits), so it shows the current share of each limit past 80 %
("Daily limit $0.0800: 99 % used ($0.0792)"), and a line goes as soon as the limit is
raised above it or its period rolls over. The warning rows (``BudgetWarning``) stay what they
are: the record that a notification went out once. Each job a limit paused has a line saying
what the reader can do about it (``billing.resume``): an admin is sent to the limit's page
(and told who asked to resume), a member is told which admins can raise it, and once the
job fits again both read that it can be resumed now.

While any limit applies to the team the banner polls its own fragment (``limits_banner``,
htmx, every ``POLL_S``), as the job page polls its live part; a team without limits is
not polled at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse

from billing.enforce import statuses_to_check
from billing.models import LimitKind, TeamBudget
from billing.resume import banner_line
from billing.services import WARN_AT, LimitStatus
from jobs.models import Job, JobState
from nomadgpu.humanize import money, percent_of
from nomadgpu.permissions import get_team_for_member_or_404

PAUSED_LINES = 3  # a line each for the newest paused jobs; beyond, a count
POLL_S = 10  # the budget pass runs every few seconds; a banner a few seconds late is fine
WARN_PERCENT = round(WARN_AT * 100)


@dataclass(frozen=True)
class Banner:
    """What the banner shows (LINES) and the fragment it polls (POLL_URL, "" for none)."""

    lines: list[str]
    poll_url: str = ""
    poll_s: int = POLL_S


def limits_apply(team) -> bool:
    """Whether any spending limit can apply to TEAM now: one of its period or member limits
    is set, or an active job has a limit of its own."""
    budget = TeamBudget.objects.filter(team=team).first()
    if budget is not None and any(
        value is not None
        for value in (
            budget.daily_usd,
            budget.weekly_usd,
            budget.monthly_usd,
            budget.member_monthly_usd,
        )
    ):
        return True
    active = Job.objects.active().filter(team=team)
    return active.exclude(budget_usd=None).exists()


def whose(status: LimitStatus) -> str:
    """Whom a job or member limit belongs to, as the line names it ("" for the team's)."""
    if status.kind == LimitKind.JOB:
        return f" of job {Job.objects.values_list('name', flat=True).get(pk=status.job_id)}"
    if status.kind == LimitKind.MEMBER_MONTH and status.user_id:
        name = get_user_model().objects.filter(pk=status.user_id).first()
        return f" of {name}" if name else ""
    return ""


def limit_line(status: LimitStatus) -> str:
    """ "Daily limit $0.0800: 99 % used ($0.0792)": the share computed from the amounts as
    written, so the line agrees with itself."""
    pct = percent_of(status.spent_usd, status.limit_usd)
    return f"{status.label.capitalize()}{whose(status)}: {pct} % used ({money(status.spent_usd)})"


def lines_for(team, *, now: datetime, user=None) -> list[str]:
    """The banner's lines for TEAM at NOW: each limit at or past 80 % in its current period,
    fullest first, then the jobs a limit paused (they stay paused until resumed), each with
    what USER can do about it (``billing.resume.banner_line``: raise the limit, ask an admin
    by name, or resume now that it fits)."""
    statuses = [
        s
        for s in statuses_to_check(team, now=now)
        if (percent_of(s.spent_usd, s.limit_usd) or 0) >= WARN_PERCENT
    ]
    statuses.sort(key=lambda s: s.ratio, reverse=True)
    lines = [limit_line(s) for s in statuses[:5]]
    paused = Job.objects.filter(team=team, state=JobState.PAUSED_BUDGET).select_related("team")
    shown = list(paused.order_by("-updated_at", "-pk")[: PAUSED_LINES + 1])
    if user is not None:
        lines += [banner_line(job, user=user, now=now) for job in shown[:PAUSED_LINES]]
    if len(shown) > PAUSED_LINES or (user is None and shown):
        count = paused.count()
        lines.append(
            f"{count} job{'s' if count != 1 else ''} paused by a spending limit: "
            "see each job's page for what can be done"
        )
    return lines


def banner_for(team, *, now: datetime, user=None) -> Banner:
    """The banner of TEAM at NOW as USER sees it (nothing for no team)."""
    if team is None:
        return Banner([])
    lines = lines_for(team, now=now, user=user)
    polled = bool(lines) or limits_apply(team)
    url = reverse("budget-banner", args=[team.slug]) if polled else ""
    return Banner(lines, url)


@login_required
def limits_banner(request, slug: str):
    """The banner fragment of team SLUG, for its members (an outsider gets 404): what
    ``templates/billing/_budget_banner.html`` polls."""
    team = get_team_for_member_or_404(request.user, slug)
    return render(request, "billing/_budget_banner.html", {"current_team": team})
