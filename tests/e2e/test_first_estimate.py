"""The toy's first estimate is near what it costs: the new-job preview of the toy template, for a
team that never ran it (every figure typed), against the invoice of the same job run through the
whole supervisor on the sandbox.

The sandbox bills the GPU while an instance is running, its disk while it exists and traffic by
the byte, so a ``--fast`` sandbox (short scheduling and pulls, which bill no GPU) bills what a
real-time one would: the toy's steps and the agent's work are real seconds either way."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from billing import invoices
from billing.cost import job_cost
from jobs.job_templates import template_spec
from jobs.models import Job, JobState
from nomadgpu.models import Role
from portal.forms import spec_to_initial
from tests.support.factories import MembershipFactory
from tests.support.waiting import wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_toys_first_preview_is_within_twice_its_invoiced_cost(supervisor, client):
    MembershipFactory(team=supervisor.team, user=supervisor.user, role=Role.MEMBER)
    client.force_login(supervisor.user)
    form = {**spec_to_initial(template_spec("toy")), "team": supervisor.team.slug}
    form["verified_only"] = "on"

    preview = client.post(
        reverse("job-new"), {**form, "action": "preview"}, HTTP_HX_REQUEST="true"
    ).context["preview"]
    submitted = client.post(reverse("job-new"), form)

    assert submitted.status_code == 302, submitted.context["form"].errors
    job = Job.objects.get(team=supervisor.team)
    wait_state(job, JobState.SUCCEEDED, timeout=300)
    invoices.sync_team(supervisor.team, now=timezone.now())
    cost = job_cost(job)
    estimate = preview.estimated_total_usd
    print(f"first preview ${estimate:.4f}, invoiced ${cost.amount:.4f}")
    assert cost.basis == "invoiced"
    assert estimate / 2 <= cost.amount <= estimate * 2
