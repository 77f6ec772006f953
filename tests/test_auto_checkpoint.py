"""``checkpoint = "auto"``: the watchdog asks at the Young/Daly interval, once per request, says
once when the script ignores it, and the job page shows the interval and why."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import lifecycle
from jobs.checkpoints import interval as ci
from jobs.checkpoints import requests
from jobs.models import Attempt, Checkpoint, JobEvent
from jobs.renting import interruption_rates
from jobs.spec import JobSpec
from jobs.watchdog import passes
from tests.support.factories import CheckpointFactory, JobFactory, make_attempt

pytestmark = pytest.mark.django_db

START = timezone.now().replace(microsecond=0) - timedelta(days=1)
AUTO = {"checkpoint": "auto"}


def running(team=None, *, profile=None, **fields) -> Attempt:
    job = JobFactory(
        **({"team": team} if team else {}),
        profile=AUTO if profile is None else profile,
        heartbeat_interval_s=15,
        total_steps=300,
    )
    attempt, _ = make_attempt(
        job,
        state="running",
        gpu_name="RTX 4090",
        rental="on-demand",
        # No rented_at: the team's rates would count this attempt's own clean hours, and the
        # interval would grow with the clock the tests move.
        running_at=START,
        seconds_per_step=4.0,
        **fields,
    )
    return attempt


def interval(attempt: Attempt) -> int:
    """The attempt's interval in whole seconds, rounded up (timedelta keeps microseconds)."""
    rates = interruption_rates.preemption_rates(attempt.job.team_id, now=START)
    return math.ceil(requests.interval_for(attempt, rates=rates, now=START).interval_s)


def asked(attempt: Attempt) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=attempt.job_id, kind="checkpoint_asked"))


def deliver(attempt: Attempt) -> None:
    """What the heartbeat does with a pending checkpoint_now: answers it once, then clears it."""
    Attempt.objects.filter(pk=attempt.pk).update(pending_command="")


def ready_checkpoint(attempt: Attempt, *, step: int, created, upload_s: float = 20.0):
    return CheckpointFactory(
        attempt=attempt,
        step=step,
        state="ready",
        created_at=created,
        ready_at=created + timedelta(seconds=upload_s),
    )


def test_the_spec_takes_checkpoint_auto_into_the_profile():
    spec = JobSpec(name="j", image="img", command="c", profile={"checkpoint": "auto"})

    assert spec.job_fields()["profile"]["checkpoint"] == "auto"
    assert JobSpec(name="j", image="img", command="c").profile.checkpoint == "script"


def test_the_on_demand_prior_with_the_default_delta_gives_about_an_hour():
    attempt = running()

    # λ 0.02/h (MTBF 50 h), δ 60 s until measured: √(2·60·180000) s.
    assert interval(attempt) == math.ceil((2 * 60 * 50 * 3600) ** 0.5)


def test_the_watchdog_asks_at_the_interval_and_not_before():
    attempt = running()
    due = START + timedelta(seconds=interval(attempt))

    assert requests.ask_due_checkpoints(due - timedelta(seconds=1)) == 0
    assert requests.ask_due_checkpoints(due) == 1

    attempt.refresh_from_db()
    assert attempt.pending_command == "checkpoint_now"
    [event] = asked(attempt)
    assert event.data["attempt_id"] == attempt.pk
    assert "Young/Daly" in event.message
    assert "δ 60 s (default until measured)" in event.message


def test_the_watchdog_tick_asks_too():
    attempt = running()
    due = START + timedelta(seconds=interval(attempt))

    assert passes.tick(now=due, poll_provider=False)["checkpoints_asked"] == 1


def test_a_pending_request_is_recorded_once():
    attempt = running()
    due = START + timedelta(seconds=interval(attempt))

    requests.ask_due_checkpoints(due)
    deliver(attempt)
    requests.ask_due_checkpoints(due + timedelta(seconds=10))
    requests.ask_due_checkpoints(due + timedelta(seconds=20))

    assert len(asked(attempt)) == 1


def test_a_command_already_pending_is_left_alone():
    attempt = running(pending_command="stop")
    due = START + timedelta(seconds=interval(attempt))

    assert requests.ask_due_checkpoints(due) == 0
    attempt.refresh_from_db()
    assert attempt.pending_command == "stop"
    assert asked(attempt) == []


def test_a_checkpoint_of_its_own_restarts_the_interval():
    attempt = running()
    every = interval(attempt)
    ready_checkpoint(attempt, step=100, created=START + timedelta(seconds=every - 60))
    # Measured δ 20 s now: a shorter interval, counted from that checkpoint's ready time.
    shorter = interval(attempt)
    ready_at = START + timedelta(seconds=every - 40)

    assert shorter < every
    assert requests.ask_due_checkpoints(ready_at + timedelta(seconds=shorter - 1)) == 0
    assert requests.ask_due_checkpoints(ready_at + timedelta(seconds=shorter)) == 1


def test_the_next_request_follows_the_checkpoint_that_answered():
    attempt = running()
    first = START + timedelta(seconds=interval(attempt))
    requests.ask_due_checkpoints(first)
    deliver(attempt)
    ready_checkpoint(attempt, step=120, created=first + timedelta(seconds=10))
    again = first + timedelta(seconds=30 + interval(attempt))

    assert requests.ask_due_checkpoints(again - timedelta(seconds=1)) == 0
    assert requests.ask_due_checkpoints(again) == 1
    assert len(asked(attempt)) == 2


def test_a_script_that_ignores_the_request_is_reported_once_and_not_asked_again():
    attempt = running()
    due = START + timedelta(seconds=interval(attempt))
    requests.ask_due_checkpoints(due)
    deliver(attempt)
    grace = ci.ignored_after_s(ci.DEFAULT_DELTA_S, 15, 4.0)

    requests.ask_due_checkpoints(due + timedelta(seconds=grace - 1))
    assert not JobEvent.objects.filter(kind="checkpoint_ignored").exists()
    for later in (grace, grace + 60, grace + 7200):
        requests.ask_due_checkpoints(due + timedelta(seconds=later))

    [event] = JobEvent.objects.filter(job_id=attempt.job_id, kind="checkpoint_ignored")
    assert "the script did not checkpoint when asked" in event.message
    assert len(asked(attempt)) == 1


def test_a_checkpoint_announced_after_the_request_is_not_ignored():
    attempt = running()
    due = START + timedelta(seconds=interval(attempt))
    requests.ask_due_checkpoints(due)
    deliver(attempt)
    CheckpointFactory(attempt=attempt, step=150, created_at=due)

    requests.ask_due_checkpoints(due + timedelta(hours=1))

    assert not JobEvent.objects.filter(kind="checkpoint_ignored").exists()


def test_a_script_job_is_never_asked():
    attempt = running(profile={})

    assert requests.ask_due_checkpoints(START + timedelta(days=1)) == 0
    attempt.refresh_from_db()
    assert attempt.pending_command == ""


def test_budget_enforcement_can_still_ask_while_auto_waits():
    attempt = running()

    assert lifecycle.request_checkpoint(attempt.pk) is True
    assert lifecycle.request_checkpoint(attempt.pk) is False  # already pending


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


def test_the_job_page_shows_the_interval_and_why(member_client, cast):
    attempt = running(cast.team_a)

    html = member_client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()

    assert "Checkpoints: every 77 min" in html  # √(2·60 s·50 h)
    assert "λ 0.020/h (prior)" in html
    assert "δ 60 s (default until measured)" in html
    assert "did not checkpoint" not in html


def test_the_job_page_warns_when_the_script_ignored_a_request(member_client, cast):
    attempt = running(cast.team_a)
    due = START + timedelta(seconds=interval(attempt))
    requests.ask_due_checkpoints(due)
    deliver(attempt)
    requests.ask_due_checkpoints(due + timedelta(hours=1))

    html = member_client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()

    assert "the script did not checkpoint when asked" in html


def test_a_script_jobs_page_says_nothing_of_intervals(member_client, cast):
    attempt = running(cast.team_a, profile={})

    html = member_client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()

    assert 'id="ckpt-interval"' not in html


def rented_on(mbps: float) -> dict:
    """The decision an attempt keeps of the offer it rented (``selection.offer_summary``)."""
    return {"chosen": {"offer": {"id": 1, "inet_up_mbps": mbps}}}


def test_before_its_first_upload_delta_comes_from_the_size_and_the_hosts_uplink():
    attempt = running(profile={**AUTO, "checkpoint_gb": 1.0}, decision=rented_on(400), offer_id=1)
    rates = interruption_rates.preemption_rates(attempt.job.team_id, now=START)

    choice = requests.interval_for(attempt, rates=rates, now=START)

    assert choice.delta_s == pytest.approx(2**30 * 8 / 400e6 + ci.UPLOAD_OVERHEAD_S)
    assert "1.0 GB at the host's advertised 400 Mbit/s up" in choice.why


def test_a_new_host_prices_the_newest_checkpoint_at_its_own_uplink_not_the_old_hosts():
    first = running(profile={**AUTO, "checkpoint_gb": 5.0})
    ready_checkpoint(first, step=100, created=START, upload_s=300.0)  # a slow old uplink
    Checkpoint.objects.filter(attempt=first).update(size=2 * 2**30)
    Attempt.objects.filter(pk=first.pk).update(state="ended")
    second, _ = make_attempt(
        first.job,
        number=2,
        state="running",
        gpu_name="RTX 4090",
        rental="on-demand",
        running_at=START,
        seconds_per_step=4.0,
        decision=rented_on(2000),
    )
    rates = interruption_rates.preemption_rates(second.job.team_id, now=START)

    choice = requests.interval_for(second, rates=rates, now=START)

    assert choice.delta_s == pytest.approx(2 * 2**30 * 8 / 2000e6 + ci.UPLOAD_OVERHEAD_S)

    # Without the new host's speed, the old host's uploads are the evidence left.
    Attempt.objects.filter(pk=second.pk).update(decision={})
    second.refresh_from_db()
    choice = requests.interval_for(second, rates=rates, now=START)
    assert (choice.delta_s, choice.why.count("on earlier hosts")) == (300.0, 1)


def test_the_rest_of_a_long_run_is_split_evenly():
    # A bid at min_bid: λ ≈ 0.52/h by the prior, δ 60 s: τ ≈ 644 s; 1000 steps of 4 s left.
    attempt = running(bid_margin=0.0, step=0, total_steps=1000)
    Attempt.objects.filter(pk=attempt.pk).update(rental="interruptible")
    attempt.refresh_from_db()
    rates = interruption_rates.preemption_rates(attempt.job.team_id, now=START)

    choice = requests.interval_for(attempt, rates=rates, now=START)

    pieces = ci.split_remaining(4000, delta_s=60, mtbf_s=choice.mtbf_s)
    assert pieces > 1
    assert choice.interval_s == pytest.approx(4000 / pieces)
    due = START + timedelta(seconds=math.ceil(choice.interval_s))
    assert requests.ask_due_checkpoints(due - timedelta(seconds=1)) == 0
    assert requests.ask_due_checkpoints(due) == 1


def test_a_job_about_to_finish_is_not_asked_and_its_page_says_why(member_client, cast):
    # A bid at min_bid (λ ≈ 0.52/h by the prior), δ 20 s: from step 0 the 300 steps of 4 s
    # would be split in two, but from its checkpoint at step 280 the 80 s left are not worth one.
    attempt = running(cast.team_a, bid_margin=0.0, step=285, total_steps=300)
    Attempt.objects.filter(pk=attempt.pk).update(rental="interruptible")
    attempt.refresh_from_db()
    rates = interruption_rates.preemption_rates(attempt.job.team_id, now=START)
    whole = ci.choose_interval(
        rate_per_h=rates.rate("interruptible", "RTX 4090", 0.0)[0],
        rate_source="prior",
        delta_s=20.0,  # what its checkpoint's upload took
        delta_source="measured",
        heartbeat_s=15,
        remaining_s=1200,
    )
    assert whole.intervals_left == 2  # so the test below is about the rest, not the job
    ready_checkpoint(attempt, step=280, created=START + timedelta(seconds=1100))

    assert requests.ask_due_checkpoints(START + timedelta(hours=6)) == 0
    assert asked(attempt) == []
    html = member_client.get(reverse("job-detail", args=[attempt.job_id])).content.decode()
    assert "Checkpoints: none before the end" in html
    assert "1 min from the last checkpoint to the end: no checkpoint pays" in html
