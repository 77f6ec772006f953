"""A job's cost is one number: the finished notification, the job page and the member API
all show billing's (``billing.reconcile.job_cost``)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import lifecycle
from nomadgpu import api_tokens
from notify import messages
from tests.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db


def finished_job(team):
    """Two attempts: one lost after 20 min at $0.31/h, one that ran 18 min at $0.35/h. Each
    registered a minute after its rent (the GPU is billed from then) and moved 3 GB."""
    start = timezone.now() - timedelta(hours=1)
    job = JobFactory(team=team, total_steps=300, created_at=start)
    first, _ = make_attempt(
        job,
        state="running",
        dph_base=0.31,
        disk_gb=40,
        storage_usd_per_gb_hour=0.0002,
        download_usd_per_gb=0.01,
        bytes_down=3 * 1024**3,
        rented_at=start,
        registered_at=start + timedelta(minutes=1),
        running_at=start + timedelta(minutes=3),
    )
    lifecycle.handle_loss(
        lifecycle.Loss(first.pk, "provider_gone"), now=start + timedelta(minutes=20)
    )
    job.refresh_from_db()
    job.state = "starting"
    job.save(update_fields=["state"])
    second, _ = make_attempt(
        job,
        number=2,
        state="starting",
        dph_base=0.35,
        disk_gb=40,
        storage_usd_per_gb_hour=0.0002,
        rented_at=start + timedelta(minutes=22),
        registered_at=start + timedelta(minutes=23),
    )
    lifecycle.mark_running(second, now=start + timedelta(minutes=25))
    second.refresh_from_db()
    lifecycle.handle_exit(second, exit_code=0, reason="exited", now=start + timedelta(minutes=40))
    return job


def test_the_finished_message_the_job_page_and_the_member_api_show_one_cost(
    client, cast, monkeypatch
):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    job = finished_job(cast.team_a)

    message = messages.build(job.events.get(kind="finished"))
    client.force_login(cast.admin)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    _, token = api_tokens.create_token(user=cast.admin, name="t", now=timezone.now())
    api = client.get(f"/api/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()

    on_page = re.search(r"Cost \(estimated\)</dt><dd class=\"num\">\$([0-9.]+)</dd>", page)
    assert on_page is not None, "the job page shows no estimated cost"
    assert api["cost_basis"] == message.data["cost_basis"] == "estimated"
    assert api["cost_usd"] > 0.19  # GPU from registration, disk and the download all count
    assert message.data["cost_usd"] == pytest.approx(api["cost_usd"], abs=5e-5)
    assert on_page.group(1) == f"{api['cost_usd']:.3f}"
    assert f"Cost: ${api['cost_usd']:.2f}" in message.text
    assert api["cost_usd"] == pytest.approx(api["spend"]["total"])  # not invoiced yet
