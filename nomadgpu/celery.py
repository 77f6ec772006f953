"""The Celery app. Broker and beat schedule come from Django settings (``CELERY_*``)."""

from __future__ import annotations

import atexit
import logging
import os

from celery import Celery
from celery.signals import beat_init, worker_ready

from nomadgpu import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")
broker.register()

app = Celery("nomadgpu")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _verify_secrets_on_worker_start(**_kwargs) -> None:
    from nomadgpu.checks import verify_sealed_secrets_or_exit

    verify_sealed_secrets_or_exit()


@beat_init.connect
def _verify_secrets_on_beat_start(**_kwargs) -> None:
    from nomadgpu.checks import verify_sealed_secrets_or_exit

    verify_sealed_secrets_or_exit()


@beat_init.connect
def _record_beat_start(**_kwargs) -> None:
    """Beat is up (``nomadgpu.health``: only then is a late watchdog worth a warning); a clean
    stop (SIGTERM, Ctrl-C: beat exits through SystemExit) records that it went down on purpose."""
    from django.utils import timezone

    from nomadgpu import health

    health.record_beat_started(now=timezone.now())
    atexit.register(_record_beat_stop)


def _record_beat_stop() -> None:
    from django.db import DatabaseError
    from django.utils import timezone

    from nomadgpu import health

    try:
        health.record_beat_stopped(now=timezone.now())
    except DatabaseError as exc:  # the database went first: the next start overwrites it
        logging.getLogger(__name__).warning("could not record that beat stopped: %s", exc)
