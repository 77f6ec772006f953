"""One drill on the sandbox, read from every surface: the CLI's drill and status, the member API,
the job page, the "training again" notification and the admin show the same two figures
(``jobs.recovery_times``); the public status page, its JSON and badge show nothing of the drill,
and then count a real loss (one the sandbox injects) with that loss's figures."""

from __future__ import annotations

import httpx
import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from jobs.models import Interruption
from jobs.recovery_times import recovery_times
from nomadgpu import api_tokens
from nomadgpu.humanize import duration
from nomadgpu.models import Role, Team
from notify import messages
from tests.support.cli import Follower
from tests.support.factories import MembershipFactory
from tests.support.processes import wait_until
from tests.support.waiting import wait_checkpoint, wait_running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def figures(row: Interruption) -> tuple[str, str]:
    times = recovery_times(row)
    return duration(times.back_on_machine_s), duration(times.training_again_s)


def public(live_server, path: str) -> httpx.Response:
    cache.clear()  # the live server shares this process's cache
    return httpx.get(f"{live_server.url}/status/e2e{path}", timeout=10)


def test_one_drill_reads_the_same_everywhere_and_nowhere_public(supervisor, live_server, client):
    Team.objects.filter(pk=supervisor.team.pk).update(public_status_page=True)
    MembershipFactory(team=supervisor.team, user=supervisor.user, role=Role.ADMIN)
    token = api_tokens.create_token(user=supervisor.user, name="e2e", now=timezone.now())[1]
    job = supervisor.submit_toy(name="drilled", total_steps=900, heartbeat_interval_s=1)
    first = wait_running(job, timeout=90)
    wait_checkpoint(job, attempt=first)

    drill = Follower(live_server.url, token, "drill", str(job.pk))
    assert drill.finish(timeout=180) == 0, drill.output
    status = Follower(live_server.url, token, "status", str(job.pk))
    assert status.finish(timeout=30) == 0
    row = Interruption.objects.get(attempt=first)
    back, training = figures(row)
    api = httpx.get(
        f"{live_server.url}/api/jobs/{job.pk}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["interruption_list"][0]
    client.force_login(supervisor.user)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    admin = client.get("/admin/jobs/interruption/").content.decode()
    note = messages.build(job.events.get(kind="running_again")).text
    body, badge = public(live_server, ".json").json(), public(live_server, "/badge.svg").text

    assert row.drill
    both = f"back on a machine after {back}, training again after {training}"
    assert both in drill.output
    assert both in status.output
    assert (duration(api["back_on_machine_s"]), duration(api["training_again_s"])) == (
        back,
        training,
    )
    assert api["drill"] is True
    assert f"after {back} (" in page
    assert f"after {training} (" in page
    assert f"Where the {training} until training again went" in page
    assert f'field-back_on_machine_s">{back}<' in admin
    assert f'field-training_again_s">{training}<' in admin
    assert f"Training again after {training} (back on a machine after {back})" in note
    assert (body["interruptions"], body["incidents"], body["training_again_s"]["count"]) == (
        0,
        [],
        0,
    )
    assert "training again p90: no data" in badge
    print(f"drill: back on a machine {back}, training again {training} (sandbox seconds)")

    # A loss nobody planned (the sandbox's own destroy) is counted, with its own figures.
    second = wait_running(job, 2, timeout=30)
    supervisor.sandbox.inject(second.instance_id, "destroy")
    real = wait_until(
        lambda: Interruption.objects.filter(attempt=second).exclude(training_again_at=None).first(),
        timeout=120,
        what="the job to train again after the real loss",
    )
    body, badge = public(live_server, ".json").json(), public(live_server, "/badge.svg").text
    real_back, real_training = figures(real)
    times = recovery_times(real)

    assert not real.drill
    assert body["interruptions"] == 1
    assert body["back_on_machine_s"]["median"] == times.back_on_machine_s
    assert body["training_again_s"]["median"] == times.training_again_s
    assert f"training again p90: {real_training}" in badge
    print(f"real loss: back on a machine {real_back}, training again {real_training}")
