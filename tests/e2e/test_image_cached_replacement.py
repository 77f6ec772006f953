"""Through the real watchdog and renting on the sandbox: a job that loses its host is moved to
a machine that already pulled its image (another job of the team ran there), over one that
did not at the same price; its container starts without the pull, none is recorded, and the
job page's decision says "image cached"."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from billing import image_pull
from jobs.models import JobState
from nomadgpu.models import Role
from tests.support.factories import MembershipFactory
from tests.support.instances import live_instances
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.sandbox import market_offers
from tests.support.toy import TOY_ENV
from tests.support.waiting import wait_running, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TEMPLATE_ASK = 15586800  # a verified RTX 4090 of the bundled market
# Three equal RTX 4090 machines. With equal prices the ranking breaks the tie on the ask id,
# so FIRST takes the job, then PLAIN would take its replacement, were it not for the image
# that CACHED got from the big-disk job.
FIRST = {"id": 100, "machine_id": 9001, "disk_space": 30.0}
PLAIN = {"id": 101, "machine_id": 9003, "disk_space": 30.0}
CACHED = {"id": 102, "machine_id": 9002, "disk_space": 60.0}  # the only one with 50 GB free


def three_equal_machines(path) -> str:
    template = market_offers()[TEMPLATE_ASK]
    same = {"inet_down": 1000.0, "sim_speed_factor": 1.0, "inet_down_cost": 0.01}
    offers = [
        {**template, **same, **fields, "ask_contract_id": fields["id"]}
        for fields in (FIRST, PLAIN, CACHED)
    ]
    path.write_text(json.dumps(offers))
    return str(path)


@pytest.fixture
def sandbox(sandbox_factory, tmp_path):
    """The e2e sandbox on the three machines; no host wipes an image (the wipe is tested in
    tests/test_sandbox_image_cache.py)."""
    market = three_equal_machines(tmp_path / "market.json")
    return sandbox_factory("--market", market, "--image-wipe-chance", "0")


def test_a_replacement_goes_to_the_machine_that_already_pulled_the_image(supervisor, client):
    box = supervisor.sandbox
    slow_env = {**TOY_ENV, "TOY_STEP_SECONDS": "0.3"}  # 90 s of training: time for the rest
    job = supervisor.submit_toy(env=slow_env, heartbeat_interval_s=3)
    first = wait_running(job, 1, timeout=90)
    assert first.machine_id == FIRST["machine_id"]

    # Another job of the team needs 50 GB of disk: only CACHED has it. It pulls the image there.
    other = supervisor.submit_toy(
        name="big-disk",
        env={**TOY_ENV, "TOY_STEPS": "40"},
        total_steps=40,
        requirements={**FIELD_REPORT_REQUIREMENTS, "disk_gb": 50},
    )
    wait_state(other, JobState.SUCCEEDED, timeout=120)
    assert other.attempts.get().machine_id == CACHED["machine_id"]
    wait_until(lambda: not live_instances(box, other), timeout=30, what="CACHED to be free")

    box.inject(first.instance_id, "destroy")
    second = wait_running(job, 2, timeout=120)

    assert second.machine_id == CACHED["machine_id"]  # not PLAIN, which wins the tie otherwise
    chances = {
        c["offer"]["machine_id"]: c["cost"]["image_cached_chance"]
        for c in second.decision["candidates"]
    }
    assert chances[CACHED["machine_id"]] > 0.5
    assert chances[PLAIN["machine_id"]] == 0.0
    assert box.debug(second.instance_id)["image_source"] == "machine"  # no pull this time
    # ... and none is recorded: the poll saw no load as long as a pull (billing.image_pull).
    second.refresh_from_db()
    assert image_pull.recorded_pull(second, now=timezone.now()).bytes == 0

    MembershipFactory(team=supervisor.team, user=supervisor.user, role=Role.MEMBER)
    client.force_login(supervisor.user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "image cached (" in page
