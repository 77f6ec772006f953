"""Notifications: an outbox row per subscribed channel in the event's transaction, delivered
exactly once over real HTTP to a fake Telegram Bot API and a signature-checking webhook."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.db import transaction
from django.template import Context, Template
from django.urls import reverse
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Attempt, Interruption, Job, JobEvent
from notify import messages, outbox, tasks
from notify.models import Channel, Delivery, DeliveryState
from notify.transports import sign, telegram_payload
from tests.support import telegram_fake, webhook_receiver
from tests.support.factories import (
    ChannelFactory,
    CheckpointFactory,
    JobEventFactory,
    JobFactory,
    TeamFactory,
    make_attempt,
)
from tests.support.processes import wait_until
from tests.support.telegram_fake import blocked, chat_not_found, flood, server_error

BOT_TOKEN = "123456789:AAH-test-token-for-notify-tests"
WEBHOOK_SECRET = "whsec-0123456789abcdef0123456789abcdef"
CHAT = "4242"


@pytest.fixture
def telegram(settings):
    with telegram_fake.running() as fake:
        settings.TELEGRAM_API_URL = fake.url
        yield fake


@pytest.fixture
def receiver():
    with webhook_receiver.running(WEBHOOK_SECRET) as running:
        yield running


@pytest.fixture
def site(settings):
    settings.SITE_URL = "https://gpu.example.com"
    return settings.SITE_URL


def telegram_channel(team, **fields) -> Channel:
    values = {"name": "ops chat", "chat_id": CHAT, "telegram_bot_token": BOT_TOKEN, **fields}
    return ChannelFactory(team=team, kind="telegram", **values)


def webhook_channel(team, url: str, **fields) -> Channel:
    values = {"name": "pager", "webhook_url": url, "webhook_secret": WEBHOOK_SECRET, **fields}
    return ChannelFactory(team=team, kind="webhook", **values)


def event(job: Job, kind: str = "no_offers", *, now=None, message: str = "", **data) -> JobEvent:
    """An event and its outbox rows in one transaction, as ``jobs.lifecycle`` writes them (notify's
    signal on the new event).

    Written directly (not through services) so the test controls the enqueue call whether or
    not services already calls the hook; enqueueing twice is a no-op."""
    with transaction.atomic():
        created = JobEventFactory(
            job=job, kind=kind, created_at=now or timezone.now(), message=message, data=data
        )
        outbox.enqueue_for_event(created)
    return created


def delivery(channel: Channel) -> Delivery:
    return Delivery.objects.get(channel=channel)


# --- the outbox -------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_writes_one_delivery_per_subscribed_channel():
    team = TeamFactory()
    job = JobFactory(team=team)
    chat = telegram_channel(team)
    hook = webhook_channel(team, "https://hooks.example.com/a")
    telegram_channel(team, name="only finishes", event_kinds=["finished"])
    telegram_channel(team, name="switched off", enabled=False)
    telegram_channel(TeamFactory(), name="another team's")

    with transaction.atomic():
        host_lost = JobEvent.objects.create(job=job, kind="host_lost", data={"cause": "x"})
        again = outbox.enqueue_for_event(host_lost)

    assert again == 0  # the new event wrote its deliveries already; a second call adds none
    assert set(Delivery.objects.values_list("channel_id", flat=True)) == {chat.pk, hook.pk}
    assert set(Delivery.objects.values_list("state", flat=True)) == {DeliveryState.PENDING}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["submitted", "renting", "rented", "running", "cancelled"])
def test_events_nobody_subscribes_to_write_no_delivery(kind):
    job = JobFactory()
    telegram_channel(job.team)

    event(job, kind)

    assert not Delivery.objects.exists()


@pytest.mark.django_db
def test_deliveries_roll_back_with_their_event():
    job = JobFactory()
    telegram_channel(job.team)

    written = []

    def transition_that_fails_after_its_event() -> None:
        with transaction.atomic():
            created = JobEvent.objects.create(job=job, kind="host_lost")
            written.append(Delivery.objects.filter(event=created).count())
            raise RuntimeError("the transition failed after the event was written")

    with pytest.raises(RuntimeError):
        transition_that_fails_after_its_event()

    assert written == [1]  # written with the event, inside its transaction

    assert not JobEvent.objects.exists()
    assert not Delivery.objects.exists()


@pytest.mark.django_db
def test_enqueueing_an_event_twice_writes_nothing_more():
    job = JobFactory()
    telegram_channel(job.team)
    created = event(job, "host_lost")

    assert outbox.enqueue_for_event(created) == 0
    assert Delivery.objects.count() == 1


@pytest.mark.django_db
def test_a_real_host_loss_writes_its_delivery_in_the_loss_transaction():
    attempt, _ = make_attempt(state="running", step=120)
    telegram_channel(attempt.job.team)

    lifecycle.handle_loss(lifecycle.Loss(attempt.pk, "heartbeat_timeout"), now=timezone.now())
    host_lost = attempt.job.events.get(kind="host_lost")
    outbox.enqueue_for_event(host_lost)  # what notify's post_save hook on JobEvent does

    assert Delivery.objects.filter(event=host_lost).count() == 1


# --- delivering -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_due_delivery_is_sent_once_and_recorded(telegram, site):
    job = JobFactory(name="llama-sft")
    chat = telegram_channel(job.team)
    event(job, "no_offers", message="no offer matches the requirements")
    now = timezone.now()

    first = outbox.deliver_due(now)
    second = outbox.deliver_due(now + timedelta(hours=1))

    assert len(first.sent) == 1
    assert not second.sent
    [sent] = telegram.messages
    assert (sent.token, sent.chat_id) == (BOT_TOKEN, CHAT)
    assert sent.payload["parse_mode"] == "HTML"
    assert sent.payload["disable_web_page_preview"] is True
    assert f"{site}/jobs/{job.pk}/" in sent.text
    row = delivery(chat)
    assert (row.state, row.attempts, row.next_attempt_at) == (DeliveryState.SENT, 1, None)
    assert row.sent_at is not None


@pytest.mark.django_db
def test_an_empty_channel_token_falls_back_to_the_teams_bot(telegram):
    team = TeamFactory(telegram_bot_token="987654:team-wide-bot-token")
    job = JobFactory(team=team)
    telegram_channel(team, telegram_bot_token="")
    event(job)

    outbox.deliver_due(timezone.now())

    assert telegram.messages[0].token == "987654:team-wide-bot-token"


@pytest.mark.django_db(transaction=True)
def test_concurrent_loops_deliver_each_row_exactly_once(telegram, receiver):
    team = TeamFactory()
    telegram_channel(team)
    webhook_channel(team, receiver.url)
    jobs = [JobFactory(team=team, name=f"job-{n}") for n in range(8)]
    for job in jobs:
        event(job, "no_offers")
    telegram.delay_s = 0.02  # slow replies, so the loops overlap on the same rows
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            start.wait()
            outbox.deliver_due(timezone.now())
        except BaseException as exc:
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    assert sorted(m.text.splitlines()[0] for m in telegram.messages) == sorted(
        f"⏳ <b>No offer matches</b> · job-{n}" for n in range(8)
    )
    assert sorted(body["job"]["name"] for body in receiver.accepted) == sorted(
        job.name for job in jobs
    )
    assert set(Delivery.objects.values_list("state", "attempts")) == {(DeliveryState.SENT, 1)}


@pytest.mark.django_db(transaction=True)
def test_the_worker_task_and_a_direct_call_together_send_each_row_once(
    telegram, celery_worker_thread
):
    job = JobFactory()
    telegram_channel(job.team)
    for n in range(5):
        event(job, "no_offers", message=f"episode {n}")
    telegram.delay_s = 0.02

    tasks.deliver_due.delay()
    outbox.deliver_due(timezone.now())

    wait_until(
        lambda: not Delivery.objects.exclude(state=DeliveryState.SENT).exists(),
        timeout=30,
        what="every delivery to be sent",
    )
    assert len(telegram.messages) == 5
    assert [m.text.split("\n")[1] for m in telegram.messages] == [f"episode {n}" for n in range(5)]


@pytest.mark.django_db
def test_a_transient_error_is_retried_with_backoff_then_sent(telegram):
    job = JobFactory()
    chat = telegram_channel(job.team)
    event(job)
    telegram.fail_next(server_error())
    now = timezone.now()

    outbox.deliver_due(now)
    row = delivery(chat)
    assert row.state == DeliveryState.PENDING
    assert row.attempts == 1
    assert "502" in row.last_error
    assert row.next_attempt_at >= now + outbox.backoff(1)

    assert not outbox.deliver_due(now + timedelta(seconds=5)).sent  # not due yet
    assert outbox.deliver_due(row.next_attempt_at).sent == [row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts) == (DeliveryState.SENT, 2)
    assert len(telegram.messages) == 1
    assert Channel.objects.get(pk=chat.pk).enabled


def test_backoff_doubles_from_15_seconds_up_to_half_an_hour():
    assert [outbox.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [15, 30, 60, 120]
    assert outbox.backoff(30).total_seconds() == 1800


@pytest.mark.django_db
def test_a_delivery_that_keeps_failing_gives_up_but_keeps_the_channel(telegram):
    job = JobFactory()
    chat = telegram_channel(job.team)
    event(job)
    telegram.fail_next(*[server_error()] * outbox.MAX_ATTEMPTS)
    now = timezone.now()

    for _ in range(outbox.MAX_ATTEMPTS):
        outbox.deliver_due(now)
        now += timedelta(seconds=outbox.BACKOFF_CAP_S + 60)

    row = delivery(chat)
    assert row.state == DeliveryState.FAILED
    assert row.attempts == outbox.MAX_ATTEMPTS
    assert row.last_error.startswith(f"gave up after {outbox.MAX_ATTEMPTS} attempts")
    assert Channel.objects.get(pk=chat.pk).enabled


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reply", "reason"),
    [(blocked, "bot was blocked by the user"), (chat_not_found, "chat not found")],
)
def test_a_permanent_telegram_error_disables_the_channel_with_the_reason(telegram, reply, reason):
    job = JobFactory()
    chat = telegram_channel(job.team)
    event(job, "host_lost")
    event(job, "running_again")
    telegram.fail_next(reply())

    outbox.deliver_due(timezone.now())

    chat.refresh_from_db()
    assert not chat.enabled
    assert reason in chat.disabled_reason
    assert chat.disabled_at is not None
    states = list(Delivery.objects.order_by("event_id").values_list("state", "last_error"))
    assert states[0] == (
        DeliveryState.FAILED,
        f"Telegram {reply()[0]}: {reply()[1]['description']}",
    )
    assert states[1][0] == DeliveryState.FAILED
    assert states[1][1].startswith("channel disabled")
    assert telegram.requests == 1  # the second was never attempted
    event(job, "finished")
    assert Delivery.objects.count() == 2  # a disabled channel gets no new rows


@pytest.mark.django_db
def test_flood_control_retry_after_is_honoured(telegram):
    job = JobFactory()
    chat = telegram_channel(job.team)
    event(job)
    telegram.fail_next(flood(42))
    now = timezone.now()

    outbox.deliver_due(now)

    row = delivery(chat)
    assert row.state == DeliveryState.PENDING
    assert row.next_attempt_at >= now + timedelta(seconds=42)
    assert not outbox.deliver_due(now + timedelta(seconds=41)).sent
    assert outbox.deliver_due(now + timedelta(seconds=43)).sent == [row.pk]
    assert Channel.objects.get(pk=chat.pk).enabled


@pytest.mark.django_db
def test_a_migrated_chat_id_is_followed_and_stored(telegram):
    job = JobFactory()
    chat = telegram_channel(job.team, chat_id="-4001")
    telegram.migrated["-4001"] = "-1004001"
    event(job, "host_lost")

    report = outbox.deliver_due(timezone.now())

    assert len(report.sent) == 1
    chat.refresh_from_db()
    assert chat.chat_id == "-1004001"
    assert chat.enabled
    event(job, "running_again")
    outbox.deliver_due(timezone.now())
    assert [m.chat_id for m in telegram.messages] == ["-1004001", "-1004001"]
    assert telegram.requests == 3  # one refused by the old id, then straight to the new one


@pytest.mark.django_db
def test_messages_go_out_per_channel_in_event_order_even_after_a_retry(telegram):
    job = JobFactory()
    telegram_channel(job.team)
    now = timezone.now()
    event(job, "host_lost", now=now)
    event(job, "running_again", now=now)
    telegram.fail_next(server_error())

    report = outbox.deliver_due(now)
    assert report.sent == []
    assert len(report.waiting) == 1
    outbox.deliver_due(now + timedelta(minutes=1))

    assert [m.text.split(" · ")[0] for m in telegram.messages] == [
        "⚠️ <b>Host lost</b>",
        "✅ <b>Training again</b>",
    ]


@pytest.mark.django_db
def test_a_delivery_stuck_in_sending_is_taken_over_after_its_lease(telegram):
    job = JobFactory()
    chat = telegram_channel(job.team)
    event(job)
    now = timezone.now()
    row = delivery(chat)
    assert outbox.claim(row, now=now) == 1  # a worker claimed it and died mid-send

    assert not outbox.deliver_due(now + outbox.LEASE - timedelta(seconds=1)).sent
    assert outbox.deliver_due(now + outbox.LEASE).sent == [row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts) == (DeliveryState.SENT, 2)
    assert not outbox.finish(row.pk, 1, now=now, state=DeliveryState.FAILED)  # the late one


@pytest.mark.django_db
def test_one_bad_row_pushes_its_own_deadline_back_and_the_loop_goes_on(telegram, monkeypatch):
    team = TeamFactory()
    telegram_channel(team)
    broken, fine = JobFactory(team=team, name="broken"), JobFactory(team=team, name="fine")
    event(broken)
    event(fine)
    real_build = messages.build

    def build(evt):
        if evt.job_id == broken.pk:
            raise KeyError("a template bug")
        return real_build(evt)

    monkeypatch.setattr(messages, "build", build)
    now = timezone.now()

    report = outbox.deliver_due(now)

    assert len(report.sent) == 1
    assert len(report.retrying) == 1
    bad = Delivery.objects.get(event__job=broken)
    assert bad.state == DeliveryState.PENDING
    assert bad.next_attempt_at > now
    assert "a template bug" in bad.last_error
    assert "fine" in telegram.messages[0].text


# --- webhooks ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_webhook_is_signed_and_carries_the_event(receiver, site):
    job = JobFactory(name="qwen-qlora")
    webhook_channel(job.team, receiver.url)
    event(job, "failed", exit_code=3, log_tail="loading\nTraceback\nValueError: bad lr")

    outbox.deliver_due(timezone.now())

    assert receiver.rejected == []
    [body] = receiver.accepted
    assert body["event"] == "failed"
    assert body["job"] == {"id": job.pk, "name": "qwen-qlora"}
    assert body["team"]["slug"] == job.team.slug
    assert body["link"] == f"{site}/jobs/{job.pk}/"
    assert body["data"]["exit_code"] == 3
    assert "ValueError: bad lr" in body["message"]
    assert "<pre>" not in body["message"]
    assert receiver.headers[0]["X-NomadGPU-Signature"].startswith("sha256=")


def test_the_receiver_rejects_a_tampered_body_and_a_stale_timestamp(receiver):
    body = b'{"event":"finished","job":{"id":1}}'
    now = str(int(time.time()))

    good = httpx.post(receiver.url, content=body, headers=signed(now, body))
    tampered = httpx.post(receiver.url, content=body.replace(b"1", b"2"), headers=signed(now, body))
    old = str(int(time.time()) - 3600)
    stale = httpx.post(receiver.url, content=body, headers=signed(old, body))
    wrong_key = httpx.post(
        receiver.url,
        content=body,
        headers={
            "X-NomadGPU-Timestamp": now,
            "X-NomadGPU-Signature": sign("not-the-secret", now, body),
        },
    )

    assert [r.status_code for r in (good, tampered, stale, wrong_key)] == [200, 401, 400, 401]
    assert len(receiver.accepted) == 1


def signed(timestamp: str, body: bytes) -> dict[str, str]:
    return {
        "X-NomadGPU-Timestamp": timestamp,
        "X-NomadGPU-Signature": sign(WEBHOOK_SECRET, timestamp, body),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("status", [400, 404, 410])
def test_a_webhook_answering_4xx_disables_the_channel(receiver, status):
    job = JobFactory()
    hook = webhook_channel(job.team, receiver.url)
    event(job)
    receiver.answer_next(status)

    outbox.deliver_due(timezone.now())

    hook.refresh_from_db()
    assert not hook.enabled
    assert f"webhook answered {status}" in hook.disabled_reason


@pytest.mark.django_db
def test_a_webhook_answering_429_or_5xx_is_retried(receiver):
    job = JobFactory()
    hook = webhook_channel(job.team, receiver.url)
    event(job)
    receiver.answer_next(429, Retry_After="90")
    now = timezone.now()

    outbox.deliver_due(now)
    row = delivery(hook)
    assert row.state == DeliveryState.PENDING
    assert row.next_attempt_at >= now + timedelta(seconds=90)

    receiver.answer_next(503)
    outbox.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert (row.state, row.attempts) == (DeliveryState.PENDING, 2)

    outbox.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert row.state == DeliveryState.SENT
    assert Channel.objects.get(pk=hook.pk).enabled
    assert receiver.events() == ["no_offers"]


@pytest.mark.django_db
def test_an_unreachable_webhook_is_retried():
    job = JobFactory()
    with webhook_receiver.running(WEBHOOK_SECRET) as gone:
        url = gone.url  # a port that refuses connections once the block ends
    hook = webhook_channel(job.team, url)
    event(job)

    outbox.deliver_due(timezone.now())

    row = delivery(hook)
    assert row.state == DeliveryState.PENDING
    assert "connection failed" in row.last_error
    assert Channel.objects.get(pk=hook.pk).enabled


# --- what the messages say --------------------------------------------------------------


@pytest.fixture
def recovered_job(db):
    """A job that lost its host at step 150 (checkpoint 100; its last heartbeat 31 s before the
    detection) and ran again 5 min 3 s after the detection on an RTX 4090 at $0.35/h, resumed
    from step 100, its first step 27 s later: back on a machine 5 min 34 s after the loss,
    training again 6 min 1 s after it."""
    lost_at = timezone.now() - timedelta(minutes=30)
    job = JobFactory(
        name="qwen-7b-qlora", total_steps=300, created_at=lost_at - timedelta(minutes=25)
    )
    first, _ = make_attempt(
        job,
        state="running",
        step=150,
        gpu_name="RTX 4090",
        dph_base=0.31,
        last_heartbeat_at=lost_at - timedelta(seconds=31),
        rented_at=lost_at - timedelta(minutes=20),
        registered_at=lost_at - timedelta(minutes=19),
    )
    CheckpointFactory(attempt=first, step=100, state="ready", ready_at=lost_at)
    lifecycle.handle_loss(lifecycle.Loss(first.pk, "provider_gone", "instance gone"), now=lost_at)
    Job.objects.filter(pk=job.pk).update(state="starting")  # the replacement is rented
    second, _ = make_attempt(
        job,
        number=2,
        state="starting",
        gpu_name="RTX 4090",
        dph_base=0.35,
        resumed_from_step=100,
        rented_at=lost_at + timedelta(minutes=2),
        registered_at=lost_at + timedelta(minutes=3),
    )
    lifecycle.mark_running(second, now=lost_at + timedelta(minutes=5, seconds=3))
    first_step = lost_at + timedelta(minutes=5, seconds=30)
    Attempt.objects.filter(pk=second.pk).update(first_step_at=first_step)
    lifecycle.mark_training_again(second.pk, now=first_step)
    return job


def message_for(job: Job, kind: str) -> messages.Message:
    return messages.build(job.events.get(kind=kind))


def test_host_lost_says_cause_step_and_last_checkpoint(recovered_job, site):
    text = message_for(recovered_job, "host_lost").text

    assert text.splitlines()[0] == "⚠️ Host lost · qwen-7b-qlora"
    assert "Cause: provider_gone (instance gone)" in text
    assert "Step reached: 150 / 300" in text
    assert "Last checkpoint: step 100" in text
    assert "Detected 31 s after the last heartbeat" in text
    assert text.splitlines()[-1] == f"{site}/jobs/{recovered_job.pk}/"


def test_running_again_past_the_step_reached_says_the_checkpoint_came_after_the_heartbeat(
    recovered_job, site
):
    # The drill's case: the last heartbeat said 48, checkpoint 50 was uploaded after it.
    Interruption.objects.filter(job=recovered_job).update(step_reached=48, resumed_step=50)

    text = message_for(recovered_job, "running_again").text

    assert (
        "Resumed from step 50 (checkpoint 50 was written after the last heartbeat, which "
        "reported step 48: no work lost)" in text
    )


def test_running_again_says_both_figures_resumed_step_and_new_price(recovered_job, site):
    message = message_for(recovered_job, "running_again")

    assert message.text.splitlines()[0] == "✅ Training again · qwen-7b-qlora"
    assert (
        "Training again after 6 min 1 s (back on a machine after 5 min 34 s), from the loss"
        in message.text
    )
    assert "Resumed from step 100 (reached 150 before the loss)" in message.text
    assert "New host: RTX 4090 at $0.350/h" in message.text
    assert f"{site}/jobs/{recovered_job.pk}/" in message.text
    assert (message.data["back_on_machine_s"], message.data["training_again_s"]) == (334, 361)
    assert message.data["price_usd_per_hour"] == 0.35


def test_finished_says_duration_cost_and_savings(recovered_job):
    job = recovered_job
    second = job.attempts.get(number=2)
    lifecycle.handle_exit(
        second, exit_code=0, reason="exited", now=second.rented_at + timedelta(minutes=18)
    )

    message = message_for(job, "finished")

    # Billed from registration: 19 min at $0.31/h and 17 min at $0.35/h. Reference: the 38 min
    # on machines at $4.10/h (speed factor 1).
    assert "Took 45 min (38 min on machines)" in message.text
    assert "Cost (recorded): $0.197 · 1x A100 80GB on demand: $2.60" in message.text
    assert "Saved $2.40 · survived 1 interruption" in message.text
    assert message.data["cost_usd"] == pytest.approx(0.1973, abs=1e-3)


@pytest.mark.django_db
def test_failed_says_exit_code_and_last_log_lines(site):
    job = JobFactory()
    log = "\n".join(f"line {n}" for n in range(30)) + "\nRuntimeError: CUDA <oom> & co"
    created = event(job, "failed", exit_code=137, log_tail=log)

    message = messages.build(created)

    assert "exited with code 137" in message.text
    assert "RuntimeError: CUDA <oom> & co" in message.text
    assert "line 22" not in message.text
    assert "line 23" in message.text
    assert "<pre>" in message.html
    assert "&lt;oom&gt; &amp; co" in message.html


@pytest.mark.django_db
def test_budget_events_render_their_message_and_numbers_generically():
    job = JobFactory()
    created = event(
        job, "budget_warning", message="80 % of the daily budget used", spent_usd=8.0, limit_usd=10
    )

    text = messages.build(created).text

    assert "Budget at 80 %" in text
    assert "80 % of the daily budget used" in text
    assert "Spent: $8.00" in text
    assert "Limit: $10.00" in text


@pytest.mark.django_db
def test_a_job_held_for_attention_notifies_with_the_field_and_what_to_do(site):
    from jobs import attention

    job = JobFactory(state="queued", requirements={"gpu_name": "RTX 4090"})
    assert attention.hold_if_spec_invalid(job, now=timezone.now())

    text = messages.build(job.events.get(kind="needs_attention")).text

    assert "Job needs attention" in text
    assert "requirements: unknown key 'gpu_name'" in text
    assert "Fix the job in the admin" in text
    assert "Fields:" not in text  # the sentence says it; no raw list beside it


@pytest.mark.django_db
def test_telegram_accepts_every_message_as_valid_html_even_with_markup_in_names(telegram):
    job = JobFactory(name="<b>sneaky</b> & co", requirements={"gpu_names": ["RTX 4090"]})
    telegram_channel(job.team)
    for kind in ("host_lost", "running_again", "finished", "no_offers", "budget_paused"):
        event(job, kind, message="why <not> & more")
    event(job, "failed", exit_code=1, log_tail="<module> & </pre>")
    event(job, "invoice_discrepancy", message="charged $1.20 more than recorded")

    report = outbox.deliver_due(timezone.now())

    assert len(report.sent) == 7, Delivery.objects.values_list("last_error", flat=True)
    assert all("&lt;b&gt;sneaky&lt;/b&gt; &amp; co" in m.text for m in telegram.messages)


def test_a_message_too_long_for_telegram_goes_as_cut_plain_text():
    long = messages.Message(
        kind="failed", title="t", html="<b>x</b>" * 600, text="x" * 5000, link=""
    )

    payload = telegram_payload("1", long)

    assert "parse_mode" not in payload
    assert len(payload["text"]) == 4096


# --- admin and portal -------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_shows_channel_secrets_masked_and_keeps_them_when_left_blank(client, cast):
    chat = telegram_channel(cast.team_a)
    client.force_login(cast.admin)
    url = reverse("admin:notify_channel_change", args=[chat.pk])

    page = client.get(url).content.decode()
    assert BOT_TOKEN not in page
    assert "••••••••ests" in page

    form = {
        "team": cast.team_a.pk,
        "name": "ops chat renamed",
        "kind": "telegram",
        "enabled": "on",
        "event_kinds": ["host_lost", "running_again"],
        "chat_id": CHAT,
        "telegram_bot_token": "",
        "webhook_url": "",
        "webhook_secret": "",
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    chat.refresh_from_db()
    assert chat.name == "ops chat renamed"
    assert chat.telegram_bot_token == BOT_TOKEN
    assert chat.event_kinds == ["host_lost", "running_again"]


@pytest.mark.django_db
def test_admin_refuses_a_webhook_without_a_signing_secret(client, cast):
    client.force_login(cast.admin)
    form = {
        "team": cast.team_a.pk,
        "name": "hook",
        "kind": "webhook",
        "enabled": "on",
        "event_kinds": ["finished"],
        "webhook_url": "https://hooks.example.com/x",
        "webhook_secret": "",
    }

    response = client.post(reverse("admin:notify_channel_add"), form)

    assert response.status_code == 200
    assert "signing secret" in response.content.decode()
    assert not Channel.objects.exists()


@pytest.mark.django_db
def test_reenabling_a_channel_in_admin_clears_the_reason(client, cast):
    chat = telegram_channel(cast.team_a, enabled=False, disabled_reason="Telegram 403: blocked")
    client.force_login(cast.admin)
    form = {
        "team": cast.team_a.pk,
        "name": chat.name,
        "kind": "telegram",
        "enabled": "on",
        "event_kinds": ["host_lost"],
        "chat_id": CHAT,
    }

    client.post(reverse("admin:notify_channel_change", args=[chat.pk]), form)

    chat.refresh_from_db()
    assert chat.enabled
    assert chat.disabled_reason == ""


def run_action(client, action: str, channel: Channel):
    return client.post(
        reverse("admin:notify_channel_changelist"),
        {"action": action, "_selected_action": [channel.pk]},
        follow=True,
    )


@pytest.mark.django_db
def test_the_test_message_action_sends_and_reports(client, cast, telegram, receiver):
    chat = telegram_channel(cast.team_a)
    hook = webhook_channel(cast.team_a, receiver.url)
    client.force_login(cast.admin)

    chat_page = run_action(client, "send_test_message", chat).content.decode()
    hook_page = run_action(client, "send_test_message", hook).content.decode()

    assert "test message sent" in chat_page
    assert "test message sent" in hook_page
    assert "Test message" in telegram.messages[0].text
    assert receiver.events() == ["test"]


@pytest.mark.django_db
def test_the_test_message_action_reports_the_error(client, cast, telegram):
    chat = telegram_channel(cast.team_a)
    telegram.fail_next(blocked())
    client.force_login(cast.admin)

    page = run_action(client, "send_test_message", chat).content.decode()

    assert "not sent: Telegram 403: Forbidden: bot was blocked by the user" in page


@pytest.mark.django_db
def test_a_team_admin_cannot_see_another_teams_channels_or_deliveries(client, cast):
    theirs = telegram_channel(cast.team_b, name="olga chat")
    ours = telegram_channel(cast.team_a, name="alice chat")
    event(JobFactory(team=cast.team_b), "host_lost")
    client.force_login(cast.admin)

    listing = client.get(reverse("admin:notify_channel_changelist")).content.decode()
    their_page = client.get(reverse("admin:notify_channel_change", args=[theirs.pk]))
    their_delivery = Delivery.objects.get(channel=theirs)
    delivery_page = client.get(reverse("admin:notify_delivery_change", args=[their_delivery.pk]))
    deliveries = client.get(reverse("admin:notify_delivery_changelist")).content.decode()

    assert ours.name in listing
    assert theirs.name not in listing
    assert "Team B" not in listing  # not even in the team filter
    assert their_page.status_code == 404
    assert delivery_page.status_code == 404
    assert "olga" not in deliveries


@pytest.mark.django_db
def test_the_portal_card_lists_channels_with_the_reason_they_are_off(cast):
    telegram_channel(cast.team_a, name="ops chat", event_kinds=["host_lost"])
    telegram_channel(cast.team_a, name="old group", enabled=False, disabled_reason="chat not found")

    html = Template("{% load notify_tags %}{% team_channels team %}").render(
        Context({"team": cast.team_a})
    )

    assert "ops chat" in html
    assert "Host lost" in html
    assert "old group" in html
    assert "off: chat not found" in html


def test_the_outbox_is_on_the_beat_schedule_with_a_short_expiry(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["notify-deliver-due"]
    assert entry["task"] == "notify.tasks.deliver_due"
    assert entry["options"]["expires"] < entry["schedule"].total_seconds()
