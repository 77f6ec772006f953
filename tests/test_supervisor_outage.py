"""The supervisor's own outage is never a host loss (``jobs.watchdog.silence``,
``nomadgpu.ingest``).

The plain rule first, then the watchdog's tick on stored attempts and the web's beacon. The
whole stack through a real web restart and a database outage is in
``tests/e2e/test_supervisor_outage.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.models import Attempt, Interruption
from jobs.watchdog import passes, silence
from nomadgpu import ingest
from nomadgpu.models import IngestOutage, ServiceHeartbeat
from tests.support.factories import IngestOutageFactory, JobFactory, make_attempt

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=26.25)  # 1.75 x 15 s


@pytest.fixture(autouse=True)
def beacon_every_second(settings):
    settings.WEB_BEACON_INTERVAL_S = 1.0  # production's (the test process itself runs none)


def verdict(last_beat_s_ago: float, evidence: silence.Evidence, *, others: int = 0):
    return silence.heartbeat_verdict(
        last_heartbeat_at=NOW - timedelta(seconds=last_beat_s_ago),
        registered_at=NOW - timedelta(hours=1),
        interval_s=15,
        timeout=TIMEOUT,
        evidence=evidence,
        others_beating=others,
        now=NOW,
    )


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_a_silent_agent_while_others_still_beat_is_lost_at_the_usual_timeout():
    others_beat = silence.Evidence(web_seen_at=ago(0.5), last_beat_at=ago(2), beating=3)

    assert verdict(27, others_beat, others=2).kind == silence.LOST


def test_every_agent_silent_together_is_the_supervisors_silence_even_with_the_web_up():
    # The web answers (its beacon is fresh), but no agent got through since before this one's
    # next beat was due: a broken proxy, DNS or certificate, not every host at once.
    all_silent = silence.Evidence(web_seen_at=ago(0.5), last_beat_at=ago(20), beating=2)

    assert verdict(27, all_silent, others=1).kind == silence.HOLD


def test_a_lone_agent_is_lost_while_the_web_is_up_and_held_while_it_is_down():
    web_up = silence.Evidence(web_seen_at=ago(0.5), last_beat_at=ago(27), beating=1)
    web_down = silence.Evidence(web_seen_at=ago(25), last_beat_at=ago(27), beating=1)

    assert verdict(27, web_up).kind == silence.LOST
    assert verdict(27, web_down).kind == silence.HOLD


def test_silence_counts_from_the_end_of_the_newest_outage_and_one_interval_to_retry():
    after_outage = silence.Evidence(
        web_seen_at=ago(0.5), last_beat_at=ago(40), beating=1, resumed_at=ago(10)
    )

    judged = verdict(40, after_outage)

    # The agent was backing off (at most one 15 s interval between tries) while it was down.
    assert judged.kind == silence.NOT_YET
    assert judged.recheck_at == ago(10) + timedelta(seconds=15) + TIMEOUT


def test_an_agent_that_beat_after_the_outage_gets_no_extra_interval():
    after_outage = silence.Evidence(
        web_seen_at=ago(0.5), last_beat_at=ago(2), beating=2, resumed_at=ago(40)
    )

    assert verdict(27, after_outage, others=1).kind == silence.LOST


def test_without_any_beacon_silence_is_judged_as_it_always_was():
    assert verdict(27, silence.NO_EVIDENCE).kind == silence.LOST
    assert verdict(25, silence.NO_EVIDENCE).kind == silence.NOT_YET


def test_a_start_timeout_waits_out_an_outage_too():
    outage_ended = silence.Evidence(
        web_seen_at=ago(0.5), last_beat_at=None, beating=0, resumed_at=ago(5)
    )

    judged = silence.start_verdict(
        rented_at=ago(1300), start_timeout_s=1200, evidence=outage_ended, now=NOW
    )

    assert judged.kind == silence.NOT_YET
    assert judged.recheck_at == ago(5) + timedelta(seconds=1200)


# --- The watchdog's tick on stored rows ------------------------------------------------------


def running(job=None, *, beat_s_ago: float, **fields) -> Attempt:
    job = job or JobFactory(heartbeat_interval_s=15, state="running")
    attempt, _ = make_attempt(
        job,
        state="running",
        registered_at=ago(600),
        running_at=ago(590),
        last_heartbeat_at=ago(beat_s_ago),
        heartbeat_deadline=ago(beat_s_ago) + TIMEOUT,
        last_progress_at=ago(beat_s_ago),
        step=100,
        phase="running",
        gpu_ok=True,
        **fields,
    )
    return attempt


def web_beacon(seconds_ago: float) -> None:
    ServiceHeartbeat.objects.update_or_create(
        name=ingest.WEB, defaults={"last_seen_at": ago(seconds_ago)}
    )


def tick(at: datetime = NOW) -> dict:
    return passes.tick(now=at, poll_provider=False)


@pytest.mark.django_db
def test_two_jobs_silent_together_are_held_and_an_outage_is_opened():
    web_beacon(0.5)
    first, second = running(beat_s_ago=40), running(beat_s_ago=39)

    report = tick()

    assert report["lost"] == 0
    assert not Interruption.objects.exists()
    outage = IngestOutage.objects.get()
    assert (outage.cause, outage.started_at, outage.ended_at) == ("agents_silent", ago(39), None)
    assert set(Attempt.objects.values_list("state", flat=True)) == {"running"}
    assert first.pk != second.pk


@pytest.mark.django_db
def test_after_the_outage_a_frozen_host_is_found_within_an_interval_and_its_timeout():
    web_beacon(0.5)
    frozen, healthy = running(beat_s_ago=40), running(beat_s_ago=39)
    tick()  # both silent: held

    # Ingest works again: the healthy agent's beat arrives, the frozen one stays silent.
    back = NOW + timedelta(seconds=3)
    Attempt.objects.filter(pk=healthy.pk).update(
        last_heartbeat_at=back, heartbeat_deadline=back + TIMEOUT
    )
    web_beacon(-3)
    assert tick(back)["lost"] == 0  # the outage ends here; silence counts from now on
    assert IngestOutage.objects.get().ended_at == back

    # One interval (15 s) to retry after its backoff, then its usual timeout.
    found_at = back + timedelta(seconds=15) + TIMEOUT
    beat = back + timedelta(seconds=20)  # the healthy one keeps beating meanwhile
    Attempt.objects.filter(pk=healthy.pk).update(
        last_heartbeat_at=beat, heartbeat_deadline=beat + TIMEOUT
    )
    assert tick(found_at - timedelta(seconds=1))["lost"] == 0
    Attempt.objects.filter(pk=healthy.pk).update(
        last_heartbeat_at=found_at - timedelta(seconds=2), heartbeat_deadline=found_at + TIMEOUT
    )
    web_beacon(-50)
    assert tick(found_at + timedelta(seconds=1))["lost"] == 1

    interruption = Interruption.objects.get()
    assert (interruption.attempt_id, interruption.cause) == (frozen.pk, "heartbeat_timeout")


@pytest.mark.django_db
def test_a_lone_silent_job_is_held_while_the_web_is_down_and_judged_from_its_return():
    web_beacon(30)  # the web stopped 30 s ago
    lone = running(beat_s_ago=31)

    assert tick()["lost"] == 0
    outage = IngestOutage.objects.get()
    assert (outage.cause, outage.started_at) == ("web_down", ago(30))

    # The web comes back: its first beacon write ends the outage.
    returned = NOW + timedelta(seconds=2)
    ended = ingest.note_web_alive(now=returned)
    assert ended.pk == outage.pk
    assert ended.ended_at == returned
    assert tick(returned)["lost"] == 0
    retry = timedelta(seconds=15)  # an interval for its backoff to try again
    assert Attempt.objects.get(pk=lone.pk).heartbeat_deadline == returned + retry + TIMEOUT

    web_beacon(-(15 + TIMEOUT.total_seconds() + 2))  # the web keeps beating; the agent does not
    assert tick(returned + retry + TIMEOUT + timedelta(seconds=1))["lost"] == 1


@pytest.mark.django_db
def test_a_single_job_silent_while_others_beat_is_lost_as_before():
    web_beacon(0.5)
    running(beat_s_ago=27)
    running(beat_s_ago=2)

    assert tick()["lost"] == 1
    assert not IngestOutage.objects.exists()


@pytest.mark.django_db
def test_the_web_coming_back_after_nothing_could_run_records_the_outage():
    # A database outage stops the watchdog too: nobody opened an outage. The web's first
    # write after the gap records it, closed.
    web_beacon(45)

    ended = ingest.note_web_alive(now=NOW)

    assert (ended.cause, ended.started_at, ended.ended_at) == ("web_down", ago(45), NOW)
    assert ingest.note_web_alive(now=NOW + timedelta(seconds=1)) is None  # no gap: nothing


@pytest.mark.django_db
def test_stall_is_not_judged_on_a_step_reported_before_the_outage():
    # Training may well have moved during the outage: only a beat after it says it did not.
    web_beacon(0.5)
    IngestOutageFactory(cause="web_down", started_at=ago(1000), ended_at=ago(5))
    attempt = running(beat_s_ago=2000)  # its last step and beat came before the outage
    Attempt.objects.filter(pk=attempt.pk).update(heartbeat_deadline=ago(1))

    assert tick()["lost"] == 0


@pytest.mark.django_db
def test_agents_still_reconnecting_after_an_outage_open_one_that_starts_at_its_end():
    # The web came back 45 s ago (its beacon ended the outage) and no agent got through since:
    # the new outage begins when the last one ended, not at the beats from before it.
    web_beacon(0.5)
    IngestOutageFactory(cause="web_down", started_at=ago(120), ended_at=ago(45))
    running(beat_s_ago=121), running(beat_s_ago=122)

    tick()

    held = IngestOutage.objects.get(ended_at=None)
    assert (held.cause, held.started_at) == ("agents_silent", ago(45))
    assert not Interruption.objects.exists()


@pytest.mark.django_db
def test_the_web_and_the_watchdog_recording_one_outage_at_once_make_one_row():
    # A database restart reconnects the web's beacon and the watchdog together: the beacon
    # records the outage it saw end, the watchdog opens the one it saw begin, both from the
    # web's last beacon before it.
    last_beacon = ago(30)
    ended = ingest.end_outage(now=NOW, cause="web_down", started_at=last_beacon)
    opened = ingest.begin_outage(cause="web_down", started_at=last_beacon)

    assert opened.pk == ended.pk
    assert IngestOutage.objects.get().ended_at == NOW


@pytest.mark.django_db(transaction=True)
def test_the_migration_merges_outages_recorded_twice():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("nomadgpu", "0004_team_secrets"), ("nomadgpu", "0005_one_outage_per_start")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps.get_model("nomadgpu", "IngestOutage")
    old.objects.create(cause="web_down", started_at=ago(30), ended_at=ago(20))
    old.objects.create(cause="web_down", started_at=ago(30), ended_at=ago(10))
    old.objects.create(cause="agents_silent", started_at=ago(5))

    executor = MigrationExecutor(connection)
    executor.migrate([after])

    rows = list(IngestOutage.objects.order_by("started_at").values_list("started_at", "ended_at"))
    assert rows == [(ago(30), ago(10)), (ago(5), None)]


@pytest.mark.django_db
def test_a_watchdog_reading_before_the_web_recorded_the_outage_adds_no_second_one():
    # CI: after a database restart the watchdog read the web's fresh beacon but not yet the
    # outage the web was recording, and opened "no agent reached the agent API" from the
    # beats before the cut. The outage recorded meanwhile already covers that start.
    ended = ingest.end_outage(now=NOW, cause="web_down", started_at=ago(30))

    opened = ingest.begin_outage(cause="agents_silent", started_at=ago(29.9))

    assert opened.pk == ended.pk
    assert IngestOutage.objects.count() == 1
    # One that starts when the last ended is a new one (agents still silent after it).
    assert ingest.begin_outage(cause="agents_silent", started_at=NOW).pk != ended.pk


def test_another_agent_s_beat_before_the_web_recorded_the_outage_proves_nothing_yet():
    # CI: 95 ms after a database restart, one agent's beat landed and the watchdog called the
    # other agent, silent since the cut 9 s before, lost. The web's beacon had not yet
    # written, so the outage (whose end its silence is counted from) was not recorded.
    late = silence.Evidence(
        web_seen_at=ago(9), last_beat_at=ago(0.05), beating=2, web_gap=timedelta(seconds=0.6)
    )
    fresh = silence.Evidence(
        web_seen_at=ago(0.1), last_beat_at=ago(0.05), beating=2, web_gap=timedelta(seconds=0.6)
    )

    assert verdict(60, late, others=1).kind == silence.HOLD
    assert verdict(60, fresh, others=1).kind == silence.LOST  # the beacon writes: as before
