"""A host whose contract is about to end: the job is checkpointed and moved before it, as a
planned move (its own event, no interruption), and finishes with the uninterrupted weights."""

from __future__ import annotations

import pytest

from jobs.models import Interruption, JobState
from tests.support.processes import wait_until
from tests.support.toy import toy_digest, toy_env
from tests.support.waiting import wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ENDS_IN_S = 20  # the contract's end, seconds after the test moves it near


def test_a_job_moves_off_a_host_before_its_contract_ends(supervisor, settings):
    settings.CONTRACT_MOVE_LEAD_S = 12
    env = toy_env(steps=400, every=1000, step_seconds=0.05)  # checkpoints only when asked
    job = supervisor.submit_toy(env=env, total_steps=400)
    first = wait_running(job, timeout=60)
    sandbox = supervisor.sandbox
    sandbox.inject(first.instance_id, "expire-in", ENDS_IN_S)

    wait_state(job, JobState.SUCCEEDED, timeout=120)

    first.refresh_from_db()
    second = job.attempts.order_by("-number").first()
    assert first.end_reason == "contract_expiring"
    assert first.ended_at < first.contract_ends_at  # left before the end, not stopped by it
    assert second.number == 2
    assert second.machine_id != first.machine_id
    assert second.resumed_from_step is not None
    assert second.resumed_from_step > 0
    kinds = list(job.events.order_by("id").values_list("kind", flat=True))
    assert kinds.index("contract_expiring") < kinds.index("planned_move")
    assert "host_lost" not in kinds
    assert not Interruption.objects.filter(job=job).exists()  # not counted as an incident
    assert f"final-digest: {toy_digest(env)}" in second.log_tail
    wait_until(
        lambda: sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the old instance to be destroyed",
    )
