"""A job a spending limit paused, as each role sees it: who can act (the team's admins, by
name, with a link), "Ask to resume" for the others (once per pause, notified), "Resume" for
an admin, and once the limit is raised, "it can be resumed now" for everyone (``billing.resume``).
The pause's event quotes the share of the limit it fired at (``billing.enforce.release``)."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.apps import apps
from django.urls import reverse

from billing import enforce
from billing.models import ResumeRequest, TeamBudget
from jobs import lifecycle
from jobs.models import Job, JobEvent
from notify import messages
from notify.models import Channel, Delivery
from tests.support.factories import ChannelFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 11, 4, 12, tzinfo=UTC)  # a Wednesday
LATER = NOON + timedelta(minutes=1)
BERLIN_MIDNIGHT = "00:00 on Thu 5 Nov (Europe/Berlin), in 10 h 59 min"  # 23:00 UTC


def burning(team, *, since: datetime, created_by, budget_usd=None) -> Job:
    """A job training on a $0.36/h GPU since SINCE: $0.0001 a second."""
    job = JobFactory(
        team=team,
        state="running",
        created_at=since,
        created_by=created_by,
        total_steps=1000,
        budget_usd=budget_usd,
    )
    make_attempt(job, state="running", dph_base=0.36, rented_at=since, registered_at=since)
    return job


@pytest.fixture
def paused(cast, settings) -> Job:
    """Bob's job, paused by Team A's $0.0800 daily limit (its day in Berlin): $0.0792 spent at
    noon, the limit 8 s away, so the pass asks for a checkpoint and the next releases it."""
    settings.WATCHDOG_INTERVAL_S = 5
    cast.team_a.time_zone = "Europe/Berlin"
    cast.team_a.save()
    TeamBudget.objects.create(team=cast.team_a, daily_usd=Decimal("0.080"))
    job = burning(cast.team_a, since=NOON - timedelta(seconds=792), created_by=cast.member)
    enforce.budget_pass(now=NOON)
    enforce.budget_pass(now=NOON + timedelta(seconds=5))
    job.refresh_from_db()
    assert job.state == "paused_budget"
    return job


def page(client, user, job, at: datetime = LATER) -> str:
    client.force_login(user)
    with time_machine.travel(at, tick=False):
        response = client.get(reverse("job-detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def raise_limit(team, usd: str = "10") -> None:
    TeamBudget.objects.filter(team=team).update(daily_usd=Decimal(usd))


def post(client, user, name: str, job, at: datetime = LATER, **data):
    client.force_login(user)
    with time_machine.travel(at, tick=False):
        return client.post(reverse(name, args=[job.pk]), data, follow=True)


# ---- the pause itself ------------------------------------------------------------------------


def test_the_pause_quotes_the_share_it_fired_at_short_of_100_percent(paused, cast):
    event = paused.events.get(kind="budget_paused")
    message = messages.build(event)

    assert event.message.startswith(
        "paused at 99 % of the daily limit $0.0800 ($0.0797 spent), before it is crossed: "
        "machine released, no checkpoint yet"
    )
    assert event.data["percent_used"] == 99
    assert event.data["spent_usd"] == pytest.approx(0.0797)
    assert "Paused at 99 % of a spending limit" in message.text  # not "Budget reached"
    assert message.title == "Budget pause"  # the kind's name quotes no share of its own
    assert "To resume: a team admin (alice) raises the limit" in message.text
    assert "None" not in message.text  # no checkpoint yet: the item is left out


def test_a_limit_already_crossed_says_so_with_its_share(cast, settings):
    TeamBudget.objects.create(team=cast.team_a, daily_usd=Decimal("0.080"))
    job = burning(cast.team_a, since=NOON - timedelta(seconds=850), created_by=cast.member)

    enforce.budget_pass(now=NOON)

    message = job.events.get(kind="budget_paused").message
    assert message.startswith("paused at 106 % of the daily limit $0.0800 ($0.0850 spent), ")
    assert "crossed already" in message


def test_the_warning_title_quotes_its_own_share_not_the_80_percent_mark(cast):
    TeamBudget.objects.create(team=cast.team_a, daily_usd=Decimal("1.00"))
    job = burning(cast.team_a, since=NOON - timedelta(seconds=8200), created_by=cast.member)

    enforce.budget_pass(now=NOON)

    text = messages.build(job.events.get(kind="budget_warning")).text
    assert text.startswith("💸 Budget at 82 % · ")
    assert "82 % of the daily limit $1.00 used ($0.820)" in text


# ---- what each role reads and can do ----------------------------------------------------------


def test_a_member_is_told_who_can_raise_the_limit_and_may_ask_to_resume(client, cast, paused):
    html = page(client, cast.member, paused)

    assert "Paused by a spending limit: estimated cost $" in html
    assert "would cross the daily limit $0.0800: $0.0797 spent." in html
    assert 'Only a team admin can raise it: <a href="/teams/team-a/#members">alice</a>.' in html
    assert f"Or wait: the daily limit starts again at {BERLIN_MIDNIGHT}" in html
    assert ">Ask to resume</button>" in html
    assert ">Resume</button>" not in html
    assert "raise the limit, then resume from the job page" not in html  # the old dead end
    assert "only a team admin can raise it (" in html  # the banner says it too


def test_finance_reads_the_same_as_a_member(client, cast, paused):
    html = page(client, cast.finance, paused)

    assert "Only a team admin can raise it:" in html
    assert ">Ask to resume</button>" in html


def test_an_admin_is_sent_to_the_limit_and_resumes_as_before(client, cast, paused):
    html = page(client, cast.admin, paused)
    budget = TeamBudget.objects.get(team=cast.team_a)
    limits_url = reverse("admin:billing_teambudget_change", args=[budget.pk])

    assert f'Raise it on <a href="{limits_url}">the limit\'s admin page</a>, then Resume.' in html
    assert f"Or wait: the daily limit starts again at {BERLIN_MIDNIGHT}; then Resume." in html
    assert ">Resume</button>" in html
    assert ">Ask to resume</button>" not in html
    assert f'<a href="{limits_url}">raise the limit</a>, then Resume on its page' in html


def test_once_the_limit_is_raised_everyone_reads_that_it_can_be_resumed(client, cast, paused):
    raise_limit(cast.team_a)

    member, admin = page(client, cast.member, paused), page(client, cast.admin, paused)

    assert "The limits allow the rest of this job now: you can resume it." in member
    assert "The limits allow the rest of this job now: Resume it." in admin
    for html in (member, admin):
        assert "raise it" not in html
        assert "Paused by a spending limit" not in html
        assert ">Resume</button>" in html
        assert ">Ask to resume</button>" not in html
        assert "can be resumed now: the limits allow the rest of it" in html  # the banner


def test_a_member_resumes_a_job_that_fits_again_but_not_one_that_does_not(
    client, cast, paused, django_capture_on_commit_callbacks
):
    refused = post(client, cast.member, "job-resume", paused)
    assert refused.status_code == 403
    assert Job.objects.get(pk=paused.pk).state == "paused_budget"

    raise_limit(cast.team_a)
    with django_capture_on_commit_callbacks(execute=False):
        post(client, cast.member, "job-resume", paused)

    assert Job.objects.get(pk=paused.pk).state == "queued"
    assert paused.events.get(kind="budget_resumed").message.startswith("resumed by bob")


def test_an_outsider_can_neither_resume_nor_ask(client, cast, paused):
    for name in ("job-resume", "job-ask-resume"):
        assert post(client, cast.outsider, name, paused).status_code == 404
    assert not ResumeRequest.objects.exists()


# ---- ask to resume ------------------------------------------------------------------------------


def test_asking_tells_the_admins_once_per_pause(client, cast, paused):
    ChannelFactory(team=cast.team_a)  # a webhook taking every kind

    first = post(client, cast.member, "job-ask-resume", paused)
    again = post(client, cast.finance, "job-ask-resume", paused)

    [asked] = paused.events.filter(kind="resume_asked")
    assert asked.message.startswith(
        "bob asks the team's admins (alice) to resume it: estimated cost $"
    )
    assert Delivery.objects.filter(event=asked).count() == 1  # the team's channel
    assert ResumeRequest.objects.get().asked_by == cast.member
    assert (
        "Asked alice to resume " + paused.name + ": they see it on their portal pages, and 1 "
        "notification channel got it." in first.content.decode()
    )
    assert "bob already asked alice to resume" in again.content.decode()
    assert "they were told once, and are not told again" in again.content.decode()
    text = messages.build(asked).text
    assert "Asked to resume" in text
    assert "Who can: alice (the team's admins): raise the limit, then Resume" in text


def test_the_admins_see_who_asked_on_the_job_page_and_the_banner(client, cast, paused):
    post(client, cast.member, "job-ask-resume", paused)

    admin = page(client, cast.admin, paused)
    member = page(client, cast.member, paused)

    assert 'id="resume-asked">bob asked to resume it at' in admin
    assert "; bob asked to resume it at " in admin  # the banner line
    assert "bob asked the team's admins to resume it at" in member
    assert ">Ask to resume</button>" not in member  # asked: nothing more to press
    assert "the admins were asked" in member


def test_an_admin_asking_is_told_to_resume_and_notifies_no_one(client, cast, paused):
    response = post(client, cast.admin, "job-ask-resume", paused)

    html = response.content.decode()
    assert "You are an admin of the team: raise the limit, then Resume." in html
    assert not paused.events.filter(kind="resume_asked").exists()


def test_a_later_pause_can_be_asked_about_again(client, cast, paused):
    post(client, cast.member, "job-ask-resume", paused)
    raise_limit(cast.team_a)
    lifecycle.resume_job(paused.pk, by="alice", now=LATER)
    raise_limit(cast.team_a, "0.080")
    lifecycle.pause_for_budget(paused.pk, message="paused again", data={}, now=LATER)

    post(client, cast.member, "job-ask-resume", paused, at=LATER + timedelta(minutes=1))

    assert paused.events.filter(kind="resume_asked").count() == 2


def test_asking_about_a_job_that_is_not_paused_changes_nothing(client, cast):
    job = JobFactory(team=cast.team_a, state="running")

    response = post(client, cast.member, "job-ask-resume", job)

    assert f"Nothing to ask: job {job.pk} is not paused by a limit." in response.content.decode()
    assert not JobEvent.objects.filter(kind="resume_asked").exists()


def test_channels_that_took_budget_pauses_take_the_asks_after_the_migration(cast):
    takes = ChannelFactory(team=cast.team_a, event_kinds=["budget_paused", "finished"])
    other = ChannelFactory(team=cast.team_a, event_kinds=["finished"])
    migration = importlib.import_module("notify.migrations.0002_resume_asked_for_budget_channels")

    migration.add_kind(apps, None)

    assert Channel.objects.get(pk=takes.pk).event_kinds == [
        "budget_paused",
        "finished",
        "resume_asked",
    ]
    assert Channel.objects.get(pk=other.pk).event_kinds == ["finished"]
