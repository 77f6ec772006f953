"""A job budget on the sandbox at its real rates: the job is checkpointed, its host destroyed
and the job paused; raising the limit and resuming continues it from that checkpoint."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import BudgetPause
from billing.spend import job_spend
from jobs.lifecycle import resume_job
from jobs.models import Checkpoint, Job, JobState
from nomadgpu.models import ServiceHeartbeat
from tests.support.instances import live_instances
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# 300 steps of 0.1 s: 30 s of training on an H100 SXM ($1.73/h), about $0.015 in all.
RUN = toy_env(steps=300, every=100, step_seconds=0.1)


def test_a_job_reaching_its_budget_checkpoints_is_released_and_resumes(
    supervisor, enforcer, settings
):
    settings.BUDGET_CHECKPOINT_GRACE_S = 5
    settings.WATCHDOG_INTERVAL_S = 0.5
    job = supervisor.submit_toy(
        env=RUN,
        budget_usd=Decimal("0.01"),
        requirements={**FIELD_REPORT_REQUIREMENTS, "gpu_names": ["H100 SXM"]},
        # An optimistic profile: the pre-flight lets it in, the real run costs more.
        profile={
            "image_gb": 0.1,
            "model_gb": 0.0,
            "upload_gb": 0.0,
            "reference_gpu": "H100 SXM",
            "reference_seconds_per_step": 0.01,
            "container_start_s": 1,
        },
    )
    first = wait_running(job, timeout=60)

    wait_state(job, JobState.PAUSED_BUDGET, timeout=90)

    pause = BudgetPause.objects.get(job=job)
    kept = Checkpoint.objects.filter(job=job, state="ready").order_by("-step").first()
    paused = job.events.get(kind="budget_paused")
    assert kept is not None
    # The checkpoint asked for, not one from before the pause. A periodic save that lands on
    # the request's step, or was still uploading when it came, answers it too (as
    # `answer_to_request` counts it), so the step may be a multiple of 100: CI once kept 100.
    assert kept.ready_at >= pause.requested_at, (
        BudgetPause.objects.filter(pk=pause.pk).values().get(),
        list(Checkpoint.objects.filter(job=job).values("step", "state", "created_at", "ready_at")),
        list(job.events.values_list("created_at", "kind", "message")),
        list(ServiceHeartbeat.objects.values()),  # the budget pass's recent gaps
    )
    assert "job limit $0.01" in paused.message
    assert paused.data["checkpoint_step"] == kept.step
    wait_until(
        lambda: not live_instances(supervisor.sandbox, job),
        timeout=30,
        what="the paused job's instance to be destroyed",
    )
    assert supervisor.sandbox.status(first.instance_id) is None
    assert job_spend(job, now=timezone.now()).total <= 0.01

    Job.objects.filter(pk=job.pk).update(budget_usd=Decimal("1.00"))
    resume_job(job.pk, by="the e2e test", now=timezone.now())

    wait_state(job, JobState.SUCCEEDED, timeout=120)
    second = job.attempts.order_by("-number").first()
    assert second.number == 2
    assert second.resumed_from_step == kept.step
    assert f"final-digest: {toy_digest(RUN)}" in second.log_tail


def test_a_tight_limit_is_used_up_and_the_checkpoint_nearest_it_kept(
    supervisor, enforcer, settings
):
    # The grace (120 s) is longer than the money lasts (about 40 s on the H100 SXM): the first
    # checkpoint comes within seconds, and the job must train on until just before the end.
    settings.WATCHDOG_INTERVAL_S = 0.5
    run = toy_env(steps=2000, every=100_000, step_seconds=0.1)  # checkpoints only when asked
    job = supervisor.submit_toy(
        env=run,
        total_steps=2000,
        budget_usd=Decimal("0.02"),
        requirements={**FIELD_REPORT_REQUIREMENTS, "gpu_names": ["H100 SXM"]},
        profile={
            "image_gb": 0.1,
            "model_gb": 0.0,
            "upload_gb": 0.0,
            "reference_gpu": "H100 SXM",
            "reference_seconds_per_step": 0.001,
            "container_start_s": 1,
        },
    )

    wait_state(job, JobState.PAUSED_BUDGET, timeout=120)

    (attempt,) = job.attempts.all()
    kept = Checkpoint.objects.filter(job=job, state="ready").order_by("-step").first()
    spent = job_spend(job, now=timezone.now()).total
    one_interval = (attempt.dph_base + attempt.storage_usd_per_gb_hour * attempt.disk_gb) * 0.5
    assert 0.8 * 0.02 <= spent <= 0.02 + one_interval / 3600
    assert kept is not None
    assert job.events.get(kind="budget_paused").data["checkpoint_step"] == kept.step
    # The newest, not the first: the pause asked again once a checkpoint was in hand, and what
    # it kept answered that last request (newer than the one held when it asked).
    pause = BudgetPause.objects.get(job=job)
    assert pause.checkpoint_step is not None
    assert kept.step > pause.checkpoint_step
    assert kept.ready_at >= pause.asked_at
    assert Checkpoint.objects.filter(job=job, state="ready").count() >= 2
