"""The portal's ``qlora-tiny`` template submitted in the sandbox as a member would: it trains the
tiny random Qwen2 + LoRA on the CPU, loses its host in a fire drill, resumes from its newest
checkpoint on a replacement, and ends with the same adapter weights as an uninterrupted run."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import drill
from jobs.models import JobState
from jobs.spec import submit_spec
from tests.support.qlora import FINISHED, tiny_spec, uninterrupted_digest
from tests.support.waiting import wait_checkpoint, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_tiny_qlora_template_survives_a_drill_with_the_uninterrupted_weights(
    supervisor, tmp_path
):
    spec = tiny_spec()
    job = submit_spec(spec, team=supervisor.team, created_by=supervisor.user, now=timezone.now())

    first = wait_running(job, 1, timeout=300)
    wait_checkpoint(job, attempt=first, above=0)
    result = drill.drill_once(job, timeout_s=300, say=lambda line: None)
    wait_state(job, JobState.SUCCEEDED, timeout=600)

    assert result.resumed_step > 0  # from a checkpoint, not from the start
    last = job.attempts.order_by("-number").first()
    assert last.number == 2
    step, digest = FINISHED.search(last.log_tail).groups()
    assert int(step) == 80
    assert digest == uninterrupted_digest(spec, tmp_path)
    print(f"qlora-tiny in the sandbox: resumed from {result.resumed_step}, adapter {digest}")
