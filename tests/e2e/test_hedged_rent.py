"""A hedged rent through the whole supervisor on the sandbox: a toy job with ``race = 2`` gets two
instances on two machines, keeps the one whose agent registers first, destroys the other, counts
the loser's cost in the job's cost and says so on the timeline, trains to the uninterrupted
digest, and leaves nothing billing. Asserted as an order of events and their causes."""

from __future__ import annotations

import pytest

from billing.cost import job_cost
from billing.spend import racer_spend
from jobs.models import JobState, Racer, RacerState
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_job_racing_two_hosts_keeps_the_first_to_register_and_destroys_the_other(
    supervisor, uninterrupted_digest
):
    box = supervisor.sandbox
    job = supervisor.submit_toy(race=2)

    def finished() -> bool:
        job.refresh_from_db()
        if job.state in (JobState.FAILED, JobState.CANCELLED):
            pytest.fail(f"job {job.pk} ended {job.state}: {job.failure_reason}")
        return job.state == JobState.SUCCEEDED

    wait_until(finished, timeout=240, what="the raced job to finish")

    [attempt] = job.attempts.all()  # one attempt: the race is inside it
    won = Racer.objects.get(attempt=attempt, state=RacerState.WON)
    [lost] = Racer.objects.filter(attempt=attempt).exclude(pk=won.pk)
    assert attempt.raced == 2
    assert lost.state == RacerState.LOST
    assert lost.machine_id != won.machine_id
    # The winner's instance is the attempt's, and it trained to the end.
    assert attempt.instance_id == won.instance_id
    assert f"final-digest: {uninterrupted_digest}" in attempt.log_tail
    # The loser left its race when the winner registered, and was destroyed after that.
    assert lost.ended_at == won.registered_at
    loser = box.debug(lost.instance_id)
    assert loser["destroyed_by"]
    destroyed_at = next(e["ts"] for e in loser["events"] if e["kind"].startswith("destroyed"))
    assert destroyed_at >= won.registered_at.timestamp()
    # Its cost is the job's, and the timeline says what it was.
    cost = racer_spend(lost, now=lost.ended_at)
    assert float(job_cost(job).total) >= round(cost.total, 6)
    said = job.events.get(kind="race_won").message
    assert said.startswith(f"raced 2 hosts: kept {won.instance_id} (ready in ")
    assert f"destroyed {lost.instance_id}" in said
    assert job.events.filter(kind="race").exists()

    def nothing_billing() -> list[dict] | None:
        views = box.anon().get("/sandbox/instances").json()["instances"]
        done = all(v["destroyed_by"] and not v["billing_now"] for v in views)
        return views if done else None

    views = wait_until(nothing_billing, timeout=60, what="every instance to be destroyed")
    assert {v["id"] for v in views} == {won.instance_id, lost.instance_id}
    assert box.client().get("/api/v1/instances/").json()["instances"] == []
