"""The ``qlora-tiny`` template on two GPUs in the sandbox, submitted as a member would with
``launcher = "torchrun"`` and ``num_gpus = 2``: the supervisor rents a two-GPU offer, the agent
starts two ranks (HF ``Trainer`` DDP, gloo on the CPU), a fire drill destroys the host after a
checkpoint, a replacement resumes both ranks from it, and the adapter at the end equals that of
an uninterrupted two-rank run."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import drill
from jobs.models import JobState
from jobs.spec import JobSpec, submit_spec
from tests.support.qlora import FINISHED, tiny_spec, uninterrupted_digest
from tests.support.waiting import wait_checkpoint, wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def two_rank_spec() -> JobSpec:
    spec = tiny_spec().model_dump()
    spec.update(launcher="torchrun", total_steps=40)
    spec["requirements"] = {**spec["requirements"], "num_gpus": 2}
    return JobSpec.model_validate(spec)


def test_two_ranks_in_the_sandbox_survive_a_drill_with_the_uninterrupted_weights(
    supervisor, tmp_path
):
    spec = two_rank_spec()
    job = submit_spec(spec, team=supervisor.team, created_by=supervisor.user, now=timezone.now())

    first = wait_running(job, 1, timeout=300)
    wait_checkpoint(job, attempt=first, above=0)
    result = drill.drill_once(job, timeout_s=300, say=lambda line: None)
    wait_state(job, JobState.SUCCEEDED, timeout=600)

    assert result.resumed_step > 0  # from a checkpoint, not from the start
    last = job.attempts.order_by("-number").first()
    assert last.number == 2
    ends = FINISHED.findall(last.log_tail)
    assert len(ends) == 2  # each rank says so: two processes ran
    step, digest = ends[0]
    assert int(step) == 40
    python, rest = spec.command.split(" ", 1)
    ranks = f"{python} -m torch.distributed.run --standalone --nproc_per_node=2"
    reference = spec.model_copy(update={"command": f"{ranks} {rest}"})
    assert digest == uninterrupted_digest(reference, tmp_path)
    print(f"two ranks in the sandbox: resumed from {result.resumed_step}, adapter {digest}")
