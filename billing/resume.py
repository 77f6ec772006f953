"""A budget-paused job: who may resume it, what the person looking at it can do, and a
member's ask that the team's admins resume it.

Who may resume (``may_resume``): a team admin, whenever the spending gate allows it
(``lifecycle.resume_job`` asks); any other member of the team (member or finance) once the job
fits under every limit again (``services.resume_limit`` finds none in the way), which is the
rule a submit follows: any of them may start a job that fits the limits the admins set. While a
limit still stands in the way only an admin can move it, so the others get "Ask to resume":
it writes a ``resume_asked`` event (on the job's timeline; ``notify`` sends it to the team's
channels) and shows on the admins' pages (the banner, the job page), once per pause: the ask
is keyed by the event that paused the job (``ResumeRequest``), so asking again notifies no one
twice, and the next pause may be asked about again.

What the page says follows the limit in the way now, never the one that paused the job: once
the limit is raised (or its period rolls over) "raise the limit" gives way to "it can be
resumed now".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from billing import next_steps, services
from billing.models import LimitKind, ResumeRequest, TeamBudget
from jobs import lifecycle
from jobs.models import Job, JobEvent, JobState
from jobs.stored_spec import StoredSpecInvalid
from nomadgpu.models import Role
from nomadgpu.permissions import can_manage_team, role_in
from nomadgpu.team_admins import admin_names, name_of

ASKED = "resume_asked"  # the event kind an ask writes (notify.models.EventKind.RESUME_ASKED)


class NotPaused(Exception):
    """The job is not paused by a spending limit (any more): there is nothing to ask."""


@dataclass(frozen=True)
class PausedHelp:
    """What the person looking at a budget-paused job can do about it."""

    job: Job
    blocker: str  # why it cannot resume now; "" once it fits again
    rollover: str  # "the daily limit starts again at ..."; "" when waiting does not help
    is_admin: bool
    admins: str  # "alice or carol"
    team_url: str  # where the team's members and roles are listed
    limits_url: str  # the admin page of the limit in the way ("" when none is)
    asked: ResumeRequest | None  # this pause's ask, if someone made it

    @property
    def fits(self) -> bool:
        """The limits allow the rest of the job now."""
        return not self.blocker

    @property
    def can_resume(self) -> bool:
        return self.is_admin or self.fits

    @property
    def can_ask(self) -> bool:
        return not self.is_admin and not self.fits and self.asked is None

    @property
    def asker(self) -> str:
        user = self.asked.asked_by if self.asked else None
        return name_of(user) if user else "someone"


def pause_event(job: Job) -> JobEvent | None:
    """The event that paused JOB (the newest ``budget_paused``)."""
    return job.events.filter(kind="budget_paused").order_by("-pk").first()


def limit_in_the_way(job: Job, *, now: datetime):
    """(status, why) of the limit that keeps JOB from resuming now, else None. A stored spec
    that no longer validates cannot be estimated: it is in the way until fixed."""
    try:
        return services.resume_limit(job, now=now)
    except StoredSpecInvalid as exc:
        return None, f"its stored spec no longer validates ({exc}): fix it in the Job admin"


def may_resume(user, job: Job, *, now: datetime) -> bool:
    """Whether USER may resume the budget-paused JOB now (module docstring)."""
    if can_manage_team(user, job.team):
        return True
    return role_in(user, job.team) in (Role.MEMBER, Role.FINANCE) and (
        limit_in_the_way(job, now=now) is None
    )


def limits_url(job: Job, status) -> str:
    """The admin page where STATUS's limit is raised: the job's own on the Job admin, the
    team's on its spending limits (added there when the team has none yet)."""
    if status is None:
        return ""
    if status.kind == LimitKind.JOB:
        return reverse("admin:jobs_job_change", args=[job.pk])
    budget = TeamBudget.objects.filter(team_id=job.team_id).first()
    if budget is None:
        return reverse("admin:billing_teambudget_add")
    return reverse("admin:billing_teambudget_change", args=[budget.pk])


def paused_help(job: Job, *, user, now: datetime) -> PausedHelp:
    """What USER can do about the budget-paused JOB at NOW."""
    found = limit_in_the_way(job, now=now)
    status, why = found if found else (None, "")
    event = pause_event(job)
    asked = ResumeRequest.objects.filter(pause_event=event).select_related("asked_by").first()
    rollover = ""
    if status is not None:
        rollover = next_steps.rollover_text(status, job.team, now=now)
    return PausedHelp(
        job=job,
        blocker=why,
        rollover=rollover,
        is_admin=can_manage_team(user, job.team),
        admins=admin_names(job.team),
        team_url=reverse("team-detail", args=[job.team.slug]) + "#members",
        limits_url=limits_url(job, status),
        asked=asked if event else None,
    )


def ask_to_resume(job: Job, *, user, now: datetime) -> tuple[ResumeRequest, bool]:
    """USER asks the team's admins to resume the budget-paused JOB: a ``resume_asked`` event,
    once per pause. Returns the pause's ask and whether this call made it (False: someone
    asked already, and no one is notified again). Raises ``NotPaused``."""
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("team").get(pk=job.pk)
        event = pause_event(job)
        if job.state != JobState.PAUSED_BUDGET or event is None:
            raise NotPaused(f"job {job.pk} is {job.get_state_display()}, not paused by a limit")
        try:
            with transaction.atomic():
                ask = ResumeRequest.objects.create(
                    job=job, pause_event=event, asked_by=user, asked_at=now
                )
        except IntegrityError:  # asked already in this pause
            return ResumeRequest.objects.get(pause_event=event), False
        found = limit_in_the_way(job, now=now)
        why = f": {found[1]}" if found else ""
        lifecycle.record_event(
            job.pk,
            now=now,
            kind=ASKED,
            message=f"{name_of(user)} asks the team's admins ({admin_names(job.team)}) to "
            f"resume it{why}",
            asked_by=user.get_username(),
        )
    return ask, True


def banner_line(job: Job, *, user, now: datetime) -> SafeString:
    """The banner's line for one budget-paused JOB, for USER: what they can do, with links."""
    help_ = paused_help(job, user=user, now=now)
    url = reverse("job-detail", args=[job.pk])
    if help_.fits:
        return format_html(
            '<a href="{}">{}</a> can be resumed now: the limits allow the rest of it', url, job.name
        )
    if help_.is_admin and not help_.limits_url:  # no limit to raise: the page says why
        return format_html('<a href="{}">{}</a> is paused: {}', url, job.name, help_.blocker)
    if help_.is_admin:
        asked = ""
        if help_.asked:
            at = date_format(localtime(help_.asked.asked_at), "H:i")
            asked = f"; {help_.asker} asked to resume it at {at}"
        return format_html(
            '<a href="{}">{}</a> is paused by a spending limit: <a href="{}">raise the limit</a>,'
            " then Resume on its page{}",
            url,
            job.name,
            help_.limits_url,
            asked,
        )
    then = "the admins were asked" if help_.asked else "Ask to resume on its page"
    return format_html(
        '<a href="{}">{}</a> is paused by a spending limit: only a team admin can raise it '
        '(<a href="{}">{}</a>); {}',
        url,
        job.name,
        help_.team_url,
        help_.admins,
        then,
    )
