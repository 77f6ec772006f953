"""Celery tasks: thin. Each fetches by id and calls a service; all are safe to run twice.

Watchdog ticks run on their own queue (``CELERY_TASK_ROUTES``), so a slow rent or a long
budget pass (``billing.tasks.enforce_budgets``) never delays loss detection. Tasks that call
Vast have time limits, and are requeued if the worker running them dies
(``reject_on_worker_lost``; they are idempotent).
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from hosts.vast import VastClient
from jobs.checkpoints import records
from jobs.renting import race_end, rent
from jobs.staging import stage
from jobs.staging.trouble import StageTrouble, unexpected
from jobs.watchdog import passes
from nomadgpu.models import Team

logger = logging.getLogger(__name__)

# The provider's calls retry with backoff inside the client; past these a task is stuck.
VAST_TASK = {
    "reject_on_worker_lost": True,
    "soft_time_limit": settings.VAST_TASK_SOFT_LIMIT_S,
    "time_limit": settings.VAST_TASK_SOFT_LIMIT_S + 30,
}


@shared_task(ignore_result=True, **VAST_TASK)
def watchdog_tick() -> dict:
    return passes.tick(now=timezone.now())


@shared_task(ignore_result=True, **VAST_TASK)
def rent_attempt(attempt_id: int) -> str:
    return rent.rent(attempt_id, now=timezone.now())


@shared_task(
    ignore_result=True, autoretry_for=(Exception,), retry_backoff=5, max_retries=8, **VAST_TASK
)
def destroy_instance(team_id: int, instance_id: int) -> bool:
    """Stop billing for INSTANCE_ID. Retried on failure; the orphan reaper is the backstop."""
    team = Team.objects.filter(pk=team_id).first()
    with VastClient.from_settings(team) as client:
        gone_already = not client.destroy_instance(instance_id)
    logger.info("destroyed instance %s%s", instance_id, " (already gone)" if gone_already else "")
    return True


@shared_task(
    ignore_result=True, autoretry_for=(Exception,), retry_backoff=5, max_retries=8, **VAST_TASK
)
def destroy_racer(racer_id: int) -> bool:
    """Stop billing for a hedged rent's racer out of its race (``race_end.destroy_racer_instance``);
    retried on failure, and the watchdog's pass destroys any racer's instance still listed."""
    return race_end.destroy_racer_instance(racer_id, now=timezone.now())


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=5, max_retries=5)
def discard_unfinished_uploads(attempt_id: int) -> int:
    """An attempt closed with uploads in flight: give them up (``discard_unfinished``)."""
    return len(records.discard_unfinished(attempt_id))


@shared_task(ignore_result=True)
def sweep_late_uploads() -> int:
    """What a fenced agent's still-valid URLs let land on S3 after its attempt closed."""
    return records.sweep_late_uploads(now=timezone.now())


# max_retries None: Celery counts no limit of its own (its default is 3); the tries are bounded
# by ``trouble.RETRY_DELAYS_S``, and a wait for another job's mirror by its STALE_MIRROR.
@shared_task(
    bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def stage_job(self, job_id: int, failures: int = 0) -> str:
    """Mirror JOB_ID's stage entries and plan its rent (``jobs.staging.stage.stage_job``). Another
    task mirroring the same entry is waited for; a refusal fails the job at once, a transient
    fault is tried again on ``jobs.staging.trouble.RETRY_DELAYS_S`` (FAILURES so far), then
    fails it (``stage.retry_or_fail``)."""
    try:
        return stage.stage_job(job_id, now=timezone.now())
    except stage.MirrorBusy as exc:
        raise self.retry(exc=exc, countdown=2) from exc
    except Exception as exc:
        problem = exc if isinstance(exc, StageTrouble) else unexpected(exc)
        delay = stage.retry_or_fail(job_id, problem, failures=failures + 1, now=timezone.now())
        if delay is None:
            logger.warning("staging job %s failed: %s", job_id, problem.sentence)
            return stage.FAILED
        raise self.retry(exc=exc, countdown=delay, args=(job_id, failures + 1), kwargs={}) from exc
