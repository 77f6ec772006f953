"""The fire drill with notifications on: a host destroyed halfway on the sandbox produces exactly
one "host lost" and one "running again" per channel, in that order, then "job finished" —
through the real hook (notify's post_save on ``JobEvent``), the outbox and a real Celery worker,
over HTTP to a fake Telegram Bot API and a signature-checking webhook receiver."""

from __future__ import annotations

import pytest

from jobs.models import Checkpoint, Interruption, JobState
from notify.models import OPEN_STATES, Delivery, DeliveryState
from tests.support import telegram_fake, webhook_receiver
from tests.support.factories import ChannelFactory
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET = "drill-secret-0123456789abcdef"
HEADLINES = {
    "⚠️ <b>Host lost</b>": "host_lost",
    "✅ <b>Training again</b>": "running_again",
    "🏁 <b>Job finished</b>": "finished",
}


@pytest.fixture
def telegram(settings):
    with telegram_fake.running() as fake:
        settings.TELEGRAM_API_URL = fake.url
        yield fake


@pytest.fixture
def receiver():
    with webhook_receiver.running(SECRET) as running:
        yield running


def telegram_kinds(fake) -> list[str]:
    return [HEADLINES.get(text.split(" · ")[0], text) for text in fake.texts()]


def state_of(job) -> str:
    job.refresh_from_db()
    return job.state


def test_a_drill_notifies_each_channel_once_per_event_in_order(supervisor, telegram, receiver):
    team = supervisor.team
    ChannelFactory(
        team=team, kind="telegram", name="ops", chat_id="777", telegram_bot_token="1:drill-bot"
    )
    ChannelFactory(
        team=team, kind="webhook", name="hook", webhook_url=receiver.url, webhook_secret=SECRET
    )
    # Beats every 3 s: the provider's listing (polled every second here) says "offline" before
    # the heartbeat's 5.25 s of silence could, so the cause asserted below is never a race.
    job = supervisor.submit_toy(heartbeat_interval_s=3)
    wait_until(
        lambda: job.attempts.filter(state="running").exists(),
        timeout=90,
        what="the toy job to run",
    )
    wait_until(
        lambda: Checkpoint.objects.filter(job=job, state="ready", step__gte=100).exists(),
        timeout=90,
        what="a ready checkpoint at step 100",
    )
    first = job.attempts.get(state="running")

    supervisor.sandbox.inject(first.instance_id, "destroy")

    wait_until(lambda: state_of(job) == JobState.SUCCEEDED, timeout=180, what="the job to finish")
    wait_until(
        lambda: "finished" in receiver.events() and "finished" in telegram_kinds(telegram),
        timeout=30,
        what="both channels to hear that the job finished",
    )
    expected = ["host_lost", "running_again", "finished"]
    assert telegram_kinds(telegram) == expected
    assert receiver.events() == expected
    assert receiver.rejected == []
    interruption = Interruption.objects.get(attempt=first)
    assert f"Resumed from step {interruption.resumed_step}" in telegram.texts()[1]
    assert "Cause: provider_offline" in telegram.texts()[0]
    assert all(f"/jobs/{job.pk}/" in text for text in telegram.texts())
    rows = Delivery.objects.filter(event__job=job)
    # The receivers heard each event; the worker records the outcome after the transport
    # answered (a row is "sending" until then): wait for every outcome, then read them.
    wait_until(
        lambda: rows.count() == 6 and not rows.filter(state__in=OPEN_STATES).exists(),
        timeout=60,
        what="an outcome for each of the six deliveries",
    )
    assert set(rows.values_list("state", flat=True)) == {DeliveryState.SENT}
