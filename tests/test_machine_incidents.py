"""What a rental's end tells the team's memory of machines (``jobs.machine_incidents``), through
the state machine: a loss is recorded as never ready, lost while loading or running, or stalled,
and charged to its machine only when it was not ours (a supervisor outage, a provider-wide one,
the supervisor failing on the job, the job's own exit); the job avoids the machine either way.
A finished rental is a ready start with its hours and its speed against its promise."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import MachineRental
from hosts.selection import machine_memory as mm
from jobs import attention, lifecycle, machine_incidents
from nomadgpu.models import IngestOutage, ServiceHeartbeat
from tests.support.factories import JobEventFactory
from tests.support.machines import lose, rented_on

pytestmark = pytest.mark.django_db

MACHINE = 48211


@pytest.fixture(autouse=True)
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


def rented(machine: int = MACHINE, *, at=None, **fields):
    return rented_on(machine, at=at, **fields)


def test_a_host_that_never_got_ready_is_charged_to_its_machine_and_avoided_by_its_job():
    attempt = rented()
    record = lose(attempt, "never_registered")

    assert (record.incident, record.cause, record.excused) == (
        mm.NEVER_READY,
        "never_registered",
        "",
    )
    assert record.ready_at is None
    assert record.ended_at is not None
    attempt.job.refresh_from_db()
    assert attempt.job.avoid_machine_ids == [MACHINE]


def test_a_host_abandoned_at_its_start_deadline_from_bytes_never_got_ready():
    assert lose(rented(), "start_overdue").incident == mm.NEVER_READY


def test_a_host_the_provider_lost_before_its_agent_came_is_lost_while_loading():
    assert lose(rented(), "provider_gone").incident == mm.LOST_LOADING


def test_after_its_agent_registered_a_loss_is_lost_while_running_and_a_stall_a_stall():
    now = timezone.now()
    ran = rented(registered_at=now - timedelta(hours=2), state="running")
    record = lose(ran, "heartbeat_timeout", at=now)
    assert record.incident == mm.LOST_RUNNING
    assert record.running_h == pytest.approx(2.0)
    stalled = rented(registered_at=now, state="running")
    assert lose(stalled, "stalled").incident == mm.STALLED


def test_a_loss_during_a_supervisor_outage_is_not_charged_but_the_job_still_avoids_the_machine():
    now = timezone.now()
    attempt = rented(at=now - timedelta(minutes=20))
    IngestOutage.objects.create(
        cause=IngestOutage.WEB_DOWN, started_at=now - timedelta(minutes=10), ended_at=now
    )
    record = lose(attempt, "never_registered", at=now)

    assert record.incident == mm.NEVER_READY
    assert record.excused.startswith("a supervisor outage")
    attempt.job.refresh_from_db()
    assert attempt.job.avoid_machine_ids == [MACHINE]


def test_an_outage_before_the_attempt_was_last_heard_from_excuses_nothing():
    now = timezone.now()
    attempt = rented(at=now - timedelta(hours=2), registered_at=now - timedelta(hours=2))
    type(attempt).objects.filter(pk=attempt.pk).update(last_heartbeat_at=now - timedelta(minutes=1))
    IngestOutage.objects.create(
        cause=IngestOutage.WEB_DOWN,
        started_at=now - timedelta(hours=1),
        ended_at=now - timedelta(minutes=30),
    )
    attempt.refresh_from_db()
    assert lose(attempt, "provider_gone", at=now).excused == ""


def test_three_machines_lost_within_two_minutes_are_a_provider_wide_outage_all_three_excused():
    now = timezone.now()
    first = lose(rented(1), "provider_gone", at=now)
    second = lose(rented(2), "provider_offline", at=now + timedelta(seconds=50))
    assert (first.excused, second.excused) == ("", "")  # two could be chance
    third = lose(rented(3), "provider_gone", at=now + timedelta(seconds=100))

    assert third.excused == "a provider-wide outage: 3 machines lost within 2 min"
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.excused == second.excused == third.excused


def test_a_loss_while_the_providers_api_fails_is_not_charged():
    now = timezone.now()
    ServiceHeartbeat.objects.create(name="provider", last_seen_at=now, detail={"ok": False})
    assert lose(rented(), "heartbeat_timeout", at=now).excused.startswith("a provider-wide")


def test_a_loss_after_the_supervisor_failed_on_the_job_is_not_charged():
    attempt = rented()
    JobEventFactory(job=attempt.job, kind=attention.EVENT, message="the supervisor could not ...")
    assert lose(attempt, "never_registered").excused.startswith("the supervisor failed")


def test_the_names_this_module_shares_with_its_importers_agree():
    # machine_incidents cannot import lifecycle or attention (they import it): same words.
    assert machine_incidents.OUTBID == lifecycle.OUTBID
    assert machine_incidents.SUPERVISOR_ERROR == attention.EVENT


def test_an_outbid_is_counted_on_the_machine_never_charged():
    attempt = rented(registered_at=timezone.now(), outbids=1)
    record = lose(attempt, lifecycle.OUTBID)
    assert (record.incident, record.outbids) == ("", 2)


def test_a_finished_rental_is_a_ready_start_with_its_hours_and_its_speed_against_its_promise():
    now = timezone.now()
    attempt = rented(
        at=now - timedelta(hours=1),
        registered_at=now - timedelta(minutes=50),
        seconds_per_step=6.0,
        state="running",
    )
    lifecycle.handle_exit(attempt, exit_code=0, reason="exited", now=now)

    record = MachineRental.objects.get(attempt_id=attempt.pk)
    assert (record.incident, record.running_h) == ("", pytest.approx(50 / 60))
    assert (record.seconds_per_step, record.promised_seconds_per_step) == (6.0, 4.0)
    assert record.advertised_down_mbps == 800.0
    assert record.as_record().speed_ratio == pytest.approx(1.5)  # the field report's slow host


def test_the_memory_read_from_the_records_sets_a_machine_aside_after_two_incidents():
    now = timezone.now()
    lose(rented(at=now - timedelta(days=2)), "never_registered", at=now - timedelta(days=2))
    lose(rented(at=now - timedelta(hours=3)), "provider_gone", at=now - timedelta(hours=3))
    rented(at=now)  # live: not read until it ends

    memory = MachineRental.objects.memory(now=now, machine_ids=[MACHINE, 99])
    record = memory.record(MACHINE)
    assert (record.rentals, record.incidents) == (2, (mm.NEVER_READY, mm.LOST_LOADING))
    assert record.banned_until == now - timedelta(days=2) + timedelta(days=7)
    assert memory.record(99) is None
