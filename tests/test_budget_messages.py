"""Budget messages agree with their own percentages (amounts by the money rule, shares from
the amounts as written), and limits take the tenth of a cent Vast bills in."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from billing import enforce
from billing.models import LimitKind
from billing.services import LimitStatus
from jobs.job_templates import template_spec
from jobs.models import Job
from jobs.spec import JobSpec, ValidationError
from notify import messages
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, TeamBudgetFactory, make_attempt

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 4, 12, tzinfo=UTC)
USED = re.compile(
    r"(?P<pct>\d+) % of the job limit \$(?P<limit>[\d.]+) used \(\$(?P<spent>[\d.]+)\)"
)


def job_at_82_percent(team):
    """A $0.0100 job limit and $0.0082 spent: 82 s on a $0.36/h GPU."""
    since = NOW - timedelta(seconds=82)
    job = JobFactory(team=team, state="running", created_at=since, budget_usd=Decimal("0.010"))
    make_attempt(job, state="running", dph_base=0.36, rented_at=since, registered_at=since)
    return job


def agrees(sentence: re.Match) -> bool:
    """Whether a sentence's percentage is its amounts' (rounded down, as a share is read)."""
    shown = Decimal(sentence["spent"]) / Decimal(sentence["limit"]) * 100
    return int(sentence["pct"]) == int(shown)


def test_the_warning_says_the_share_and_the_amount_that_agree(cast):
    job = job_at_82_percent(cast.team_a)

    enforce.budget_pass(now=NOW)
    warning = job.events.get(kind="budget_warning")
    text = messages.build(warning).text

    said = USED.search(warning.message)
    assert warning.message == "82 % of the job limit $0.0100 used ($0.00820)"  # not "$0.01 ($0.01)"
    assert agrees(said)
    assert "Spent: $0.00820" in text  # the notification's items agree with its sentence
    assert "Limit: $0.0100" in text


def test_the_pause_names_the_spend_and_share_at_the_same_precision(cast):
    job = job_at_82_percent(cast.team_a)

    enforce.budget_pass(now=NOW)  # the limit is seconds away: the pause begins

    asked = job.events.get(kind="budget_checkpoint").message
    assert asked.startswith("job limit $0.0100: $0.00820 spent (82 %)")


@pytest.mark.parametrize(
    ("limit", "spent", "text"),
    [
        # The "$0.00 spent (45%)": a tenth-of-a-cent limit.
        ("0.001", 0.00045, "job limit $0.00100: $0.000450 spent (45 %)"),
        ("0.080", 0.0792, "job limit $0.0800: $0.0792 spent (99 %)"),
        ("2.00", 1.7345, "job limit $2.00: $1.73 spent (86 %)"),
    ],
)
def test_a_limits_description_agrees_with_itself(limit, spent, text):
    status = LimitStatus(LimitKind.JOB, Decimal(limit), spent, NOW, None, team_id=1, job_id=1)

    assert status.describe() == text
    assert agrees(USED.search(status.used()))


def test_the_team_limits_take_a_tenth_of_a_cent_in_the_admin(client, cast):
    budget = TeamBudgetFactory(team=cast.team_a, daily_usd=Decimal("1"))
    client.force_login(cast.admin)

    saved = client.post(
        reverse("admin:billing_teambudget_change", args=[budget.pk]),
        {"team": cast.team_a.pk, "daily_usd": "0.085", "monthly_usd": "2.125"},
    )

    assert saved.status_code == 302
    budget.refresh_from_db()
    assert (budget.daily_usd, budget.monthly_usd) == (Decimal("0.085"), Decimal("2.125"))


def test_a_jobs_limit_takes_a_tenth_of_a_cent_and_no_finer():
    spec = {"name": "j", "image": "img:1", "command": "python t.py"}

    assert JobSpec.model_validate({**spec, "budget_usd": "0.015"}).budget_usd == Decimal("0.015")
    with pytest.raises(ValidationError, match="budget_usd"):
        JobSpec.model_validate({**spec, "budget_usd": "0.0155"})


def test_the_submit_form_keeps_a_limit_of_a_tenth_of_a_cent(client, cast):
    form = {**spec_to_initial(template_spec("toy")), "team": cast.team_a.slug}
    form.update(budget_usd="0.015", start_when_budget_allows="on", verified_only="on")
    client.force_login(cast.member)

    response = client.post(reverse("job-new"), form)

    job = Job.objects.get()
    assert response.status_code == 302
    assert job.budget_usd == Decimal("0.015")
    page = client.get(reverse("job-detail", args=[job.pk]))
    assert page.status_code == 200, page
    assert "$0.0150" in page.content.decode()
