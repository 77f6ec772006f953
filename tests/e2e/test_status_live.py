"""A real recovery on the sandbox, read back from the public status page over HTTP: the numbers
are the Interruption row's, the supervisor is healthy, and the job's details stay private."""

from __future__ import annotations

import httpx
import pytest
from django.core.cache import cache

from jobs.models import Interruption
from jobs.recovery_times import recovery_times
from nomadgpu.models import Team
from tests.support.processes import wait_until
from tests.support.waiting import wait_checkpoint, wait_running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_real_recovery_shows_on_the_public_status_page(supervisor, live_server):
    Team.objects.filter(pk=supervisor.team.pk).update(public_status_page=True)
    # Beats every 3 s: the provider's listing (polled every second here) says "offline" before
    # the heartbeat's 5.25 s of silence could, so the cause asserted below is never a race.
    job = supervisor.submit_toy(name="zz-private-status-e2e", heartbeat_interval_s=3)
    first = wait_running(job, timeout=90)
    wait_checkpoint(job, attempt=first)

    supervisor.sandbox.inject(first.instance_id, "destroy")

    row = wait_until(
        lambda: Interruption.objects.filter(attempt=first).exclude(training_again_at=None).first(),
        timeout=120,
        what="the job to train again on a new host",
    )
    cache.clear()  # the live server shares this process's cache
    body = httpx.get(f"{live_server.url}/status/e2e.json", timeout=10).json()
    times = recovery_times(row)  # a destroy the sandbox injects is a real loss, not a drill
    back_s, training_s = times.back_on_machine_s, times.training_again_s
    assert (body["interruptions"], body["resumed"], body["recovering"]) == (1, 1, 0)
    assert body["back_on_machine_s"] == {"count": 1, "median": back_s, "p90": back_s}
    assert body["training_again_s"] == {"count": 1, "median": training_s, "p90": training_s}
    assert 0 < back_s < training_s
    assert body["detection_s"]["count"] == 1
    incident = body["incidents"][0]
    assert (incident["cause"], incident["outcome"]) == ("provider_offline", "resumed")
    assert incident["resumed_step"] == row.resumed_step > 0
    assert body["health"]["watchdog"]["ok"] is True
    assert body["health"]["provider"]["ok"] is True
    page = httpx.get(f"{live_server.url}/status/e2e/", timeout=10).text
    assert 'id="n-interruptions">1<' in page
    assert "zz-private-status-e2e" not in page
    assert str(first.instance_id) not in page
