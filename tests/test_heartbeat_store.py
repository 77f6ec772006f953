"""The heartbeat's two statements (``jobs.agent_api.heartbeat_store``) on whichever database the
tests use: SQLite by default, PostgreSQL (prepared on the server) with ``DATABASE_URL``."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from jobs.agent_api.heartbeat_store import (
    HEARTBEAT_ATTEMPT_FIELDS,
    Heartbeat,
    load_for_heartbeat,
    store_heartbeat,
)
from jobs.models import Attempt
from tests.support.factories import JobFactory, make_attempt

pytestmark = pytest.mark.django_db


def beat(seq: int, step: int | None = None, **fields) -> Heartbeat:
    given = {"phase": "running", "step": step, "total_steps": None, "loss": None}
    given |= {"seconds_per_step": None, "gpu_ok": True, "gpu_error": "", "bytes_down": 0}
    given |= {"bytes_up": 0, "log_tail": ""}
    return Heartbeat(seq=seq, **{**given, **fields})


def store(attempt: Attempt, heartbeat: Heartbeat) -> bool:
    now = timezone.now()
    return store_heartbeat(attempt, heartbeat, now=now, deadline=now)


def test_it_loads_the_attempt_and_its_job_with_only_the_heartbeats_fields():
    made, _ = make_attempt(JobFactory(stall_timeout_s=321), state="running", step=7)

    loaded = load_for_heartbeat(made.token_prefix)

    assert isinstance(loaded, Attempt)
    assert (loaded.pk, loaded.step, loaded.job.stall_timeout_s) == (made.pk, 7, 321)
    assert loaded.get_deferred_fields() >= {"log_tail", "decision", "gpu_error"}
    assert not HEARTBEAT_ATTEMPT_FIELDS & loaded.get_deferred_fields()


def test_an_unknown_prefix_loads_nothing():
    assert load_for_heartbeat("no-such-one") is None


def test_a_beat_is_stored_once_and_an_older_one_not_at_all():
    made, _ = make_attempt(state="running")
    attempt = load_for_heartbeat(made.token_prefix)

    first = store(attempt, beat(5, 40, log_tail="x" * 9000))
    again = store(attempt, beat(5, 41))
    older = store(attempt, beat(4, 42))
    made.refresh_from_db()

    assert (first, again, older) == (True, False, False)
    assert (made.last_seq, made.step, len(made.log_tail)) == (5, 40, 8 * 1024)


def test_a_beat_for_an_attempt_that_ended_after_its_load_is_not_stored():
    made, _ = make_attempt(state="running")
    attempt = load_for_heartbeat(made.token_prefix)
    Attempt.objects.filter(pk=made.pk).update(state="ended")

    assert store(attempt, beat(1, 1)) is False


def test_a_checkpoint_request_made_after_the_load_waits_for_the_next_beat():
    made, _ = make_attempt(state="running")
    attempt = load_for_heartbeat(made.token_prefix)  # nothing pending: this beat delivers nothing
    Attempt.objects.filter(pk=made.pk).update(pending_command="checkpoint_now")

    store(attempt, beat(1, 1))
    made.refresh_from_db()

    assert made.pending_command == "checkpoint_now"


def test_repeated_beats_are_stored_and_on_postgresql_prepared_once_per_connection():
    made, _ = make_attempt(state="running")
    for seq in (1, 2, 3):
        store(load_for_heartbeat(made.token_prefix), beat(seq, seq))

    made.refresh_from_db()
    assert made.last_seq == 3
    if connection.vendor != "postgresql":
        return  # SQLite has no server-side statements: Django's cursor runs the same SQL
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0].lstrip() for row in cursor.fetchall()]

    assert sum(text.startswith("SELECT") and "token_prefix" in text for text in prepared) == 1
    assert sum(text.startswith("UPDATE") and "last_seq" in text for text in prepared) == 1
