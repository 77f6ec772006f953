"""``manage.py check --database default`` says when the watchdog fell behind."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from nomadgpu.models import ServiceHeartbeat


def database_check() -> str:
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


@pytest.mark.django_db
def test_check_says_the_watchdog_has_not_run_for_a_while(settings):
    settings.WATCHDOG_INTERVAL_S = 1
    ServiceHeartbeat.objects.create(
        name="watchdog", last_seen_at=timezone.now() - timedelta(seconds=50)
    )

    report = database_check()

    assert "nomadgpu.W010" in report
    assert "watchdog has not run for 5" in report  # 50 s, plus the test's own seconds
    assert "celery beat" in report


@pytest.mark.django_db
def test_check_is_quiet_while_the_watchdog_keeps_up(settings):
    settings.WATCHDOG_INTERVAL_S = 1
    ServiceHeartbeat.objects.create(name="watchdog", last_seen_at=timezone.now())

    assert "W010" not in database_check()
