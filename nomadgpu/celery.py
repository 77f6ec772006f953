"""The Celery app. Broker and beat schedule come from Django settings (``CELERY_*``)."""

from __future__ import annotations

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
