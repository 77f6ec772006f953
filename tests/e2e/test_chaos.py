"""Chaos on the sandbox: each test breaks a host (or the renting) the way marketplaces do and
checks, through the database and the sandbox's own view, that the supervisor notices with the
right cause, releases what it rented and carries the job on from its newest checkpoint.

Every wait polls an observable with a deadline (``wait_until``); nothing asserts on elapsed
time. Toy runs are short (a few seconds of steps) wherever the scenario allows.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from hosts.vast import ProviderUnreachable, VastClient
from jobs import lifecycle
from jobs.models import AttemptState, Checkpoint, Interruption, Job, JobEvent, JobState
from jobs.renting import rent as renting
from nomadgpu.models import ServiceHeartbeat
from nomadgpu.storage import object_store
from tests.support.instances import InstanceWatch, live_instances
from tests.support.market import FIELD_REPORT_REQUIREMENTS
from tests.support.processes import wait_until
from tests.support.toy import final_digest_of, submit, toy_digest, toy_env
from tests.support.waiting import (
    state_of,
    wait_checkpoint,
    wait_interruption,
    wait_running,
    wait_state,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT = toy_env(steps=100, every=20, step_seconds=0.04)  # ~4 s of training
PYTHON = shlex.quote(sys.executable)


def wait_released(supervisor, job, timeout: float = 30) -> None:
    """Nothing of JOB's is left at the provider (nothing billing)."""
    wait_until(
        lambda: not live_instances(supervisor.sandbox, job),
        timeout=timeout,
        what=f"every instance of job {job.pk} to be destroyed",
    )


def watchdog_ticks() -> int:
    row = ServiceHeartbeat.objects.filter(name="watchdog").first()
    return row.count if row else 0


def wait_ticks(n: int) -> None:
    """Let N more watchdog ticks run: the way to give something the chance to happen."""
    target = watchdog_ticks() + n
    wait_until(lambda: watchdog_ticks() >= target, timeout=30, what=f"{n} watchdog ticks")


def assert_checkpoints_intact(job, attempts) -> None:
    """Every ready checkpoint of ATTEMPTS has its object, byte for byte what was reported."""
    store = object_store(job.team)
    ready = Checkpoint.objects.filter(job=job, attempt__in=attempts, state="ready")
    assert ready.exists()
    for checkpoint in ready:
        with store.open_read(checkpoint.key) as stream:
            data = stream.read()
        assert len(data) == checkpoint.size
        assert hashlib.sha256(data).hexdigest() == checkpoint.sha256


# ---- 1. destroyed twice --------------------------------------------------------------------


def test_a_job_survives_two_destroyed_hosts_and_ends_with_the_uninterrupted_weights(supervisor):
    env = toy_env(steps=150, every=25, step_seconds=0.03)
    job = submit(supervisor, env)

    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=0)
    supervisor.sandbox.inject(first.instance_id, "destroy")

    second = wait_running(job, 2)
    wait_checkpoint(job, attempt=second, above=second.resumed_from_step)
    supervisor.sandbox.inject(second.instance_id, "destroy")

    wait_state(job, JobState.SUCCEEDED, timeout=120)
    interruptions = list(Interruption.objects.filter(job=job).order_by("detected_at"))
    assert [i.attempt.number for i in interruptions] == [1, 2]
    for interruption in interruptions:
        assert interruption.cause in ("provider_offline", "heartbeat_timeout")
        assert interruption.running_again_at > interruption.replacement_rented_at
        assert interruption.resumed_step > 0
    assert interruptions[1].resumed_step > interruptions[0].resumed_step  # progress kept
    assert job.attempts.count() == 3
    assert job.events.filter(kind="host_lost").count() == 2
    assert job.events.filter(kind="running_again").count() == 2
    assert final_digest_of(job) == toy_digest(env)
    job.refresh_from_db()
    assert {first.machine_id, second.machine_id} <= set(job.avoid_machine_ids)
    wait_released(supervisor, job)


# ---- 2. frozen host: detected by silence, fenced when it wakes up ----------------------------


def test_a_frozen_host_is_replaced_and_fenced_when_it_wakes_up(supervisor, settings, monkeypatch):
    # The destroy that follows detection cannot reach a partitioned host: here the provider
    # keeps the frozen instance until the test "reconnects" it, so the zombie agent really
    # wakes up after its attempt ended. From then on destroys work again; the destroy task's
    # retry or the orphan reaper (grace shortened) removes the instance.
    settings.ORPHAN_GRACE_S = 1
    partitioned: set[int] = set()
    real_destroy = VastClient.destroy_instance

    def destroy(client, instance_id):
        if instance_id in partitioned:
            raise ProviderUnreachable(f"instance {instance_id}: host unreachable (test)")
        return real_destroy(client, instance_id)

    monkeypatch.setattr(VastClient, "destroy_instance", destroy)
    env = toy_env(steps=150, every=25, step_seconds=0.04)
    # Half-second beats: the silence that marks the host lost is under a second, not 1.75 s.
    job = submit(supervisor, env, heartbeat_interval_s=0.5)
    sandbox = supervisor.sandbox

    first = wait_running(job, 1)
    # Freeze right after a checkpoint was published: no upload of the old agent is in flight.
    wait_checkpoint(job, attempt=first, above=0)
    partitioned.add(first.instance_id)
    sandbox.inject(first.instance_id, "freeze")

    interruption = wait_interruption(first)
    assert interruption.cause == "heartbeat_timeout"
    second = wait_running(job, 2)
    assert second.instance_id != first.instance_id
    first.refresh_from_db()
    assert first.state == "ended"
    assert first.end_reason == "heartbeat_timeout"
    assert sandbox.status(first.instance_id) == "running"  # the provider still says running

    sandbox.inject(first.instance_id, "thaw")
    # The old agent's next call meets a 410: it kills its command and exits, so the
    # container's last process ends (the ssh entrypoint keeps the container itself up).
    wait_until(
        lambda: not sandbox.debug(first.instance_id)["processes"],
        timeout=30,
        what="the fenced agent on the thawed host to exit",
    )
    agent_log = Path(sandbox.debug(first.instance_id)["scratch"]) / ".nomadgpu" / "agent.log"
    log = agent_log.read_text(errors="replace")
    assert "410" in log, log[-2000:]
    assert "attempt is over on the supervisor" in log, log[-2000:]

    partitioned.clear()  # the host is reachable again: the destroy gets through
    wait_until(
        lambda: sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the old instance to be destroyed",
    )

    wait_state(job, JobState.SUCCEEDED, timeout=90)
    # Nothing of the old attempt was written after it ended: no checkpoint row, no object.
    assert not Checkpoint.objects.filter(attempt=first, created_at__gt=first.ended_at).exists()
    assert not Checkpoint.objects.filter(attempt=first, ready_at__gt=first.ended_at).exists()
    store = object_store(job.team)
    for key in store.list_keys(first.storage_prefix):
        mtime = store.path_for(key).stat().st_mtime
        assert mtime <= first.ended_at.timestamp(), f"{key} written after attempt 1 ended"
    assert_checkpoints_intact(job, job.attempts.exclude(pk=first.pk))
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


# ---- 2b. the destroy reaches the frozen host only when it wakes up ---------------------------

# Far longer than the old agent needs to meet its 410: if it stops within a heartbeat or two of
# waking, the fencing stopped it, not the queued destroy.
QUEUED_DESTROY_DELAY_S = 60


def test_a_woken_host_whose_destroy_is_still_queued_is_stopped_by_fencing(supervisor, settings):
    # No help from the test here: the sandbox itself keeps a destroyed, frozen host's processes
    # (stopped) until it is thawed, as Vast delivers a destroy to a cut-off host only when it
    # is back. The old agent then runs beside its replacement until the 410 stops it.
    env = toy_env(steps=200, every=100, step_seconds=0.04)
    job = submit(supervisor, env, heartbeat_interval_s=0.5)
    sandbox = supervisor.sandbox
    first = wait_running(job, 1)
    # Right after the first checkpoint is published, the next is 4 s away: nothing of the old
    # agent's is in flight to storage when it freezes.
    wait_checkpoint(job, attempt=first, above=0)
    sandbox.inject(first.instance_id, "freeze")
    at_freeze = files_under(settings.STORAGE_LOCAL_DIR / first.storage_prefix)
    assert at_freeze  # the checkpoint

    assert wait_interruption(first).cause == "heartbeat_timeout"
    wait_running(job, 2)
    wait_until(
        lambda: sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the old instance to be destroyed",
    )
    old = sandbox.debug(first.instance_id)
    assert (old["destroyed_by"], old["billing_now"]) == ("user", [])
    assert old["destroy_queued"] is True
    assert old["processes"], "the old host's processes were killed at the destroy"
    assert {p["state"] for p in old["processes"]} == {"T"}

    sandbox.inject(first.instance_id, "thaw", QUEUED_DESTROY_DELAY_S)
    # Within one heartbeat interval (its timer ran out while frozen, so it beats at once and
    # meets the 410), plus the few seconds its command takes to stop and the group to empty.
    wait_until(
        lambda: not sandbox.debug(first.instance_id)["processes"],
        timeout=job.heartbeat_interval_s + 5,
        what="the woken agent to stop on its own",
    )
    events = [e["kind"] for e in sandbox.debug(first.instance_id)["events"]]
    assert "queued destroy delivered" not in events, events
    log = (Path(old["scratch"]) / ".nomadgpu" / "agent.log").read_text(errors="replace")
    assert "410" in log, log[-2000:]
    assert "attempt is over on the supervisor" in log, log[-2000:]
    # Nothing new or rewritten under the old attempt's prefix (the new one may prune there).
    after = files_under(settings.STORAGE_LOCAL_DIR / first.storage_prefix)
    assert after.items() <= at_freeze.items(), (at_freeze, after)

    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below FOLDER (partial uploads too) with its size and mtime."""
    found = {}
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # pruned while we looked
            if path.is_file():
                stat = path.stat()
                found[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return found


# ---- 3. GPU fault ----------------------------------------------------------------------------


# nvidia-smi failing is seen at the next reading; a hung one only after the agent's 10 s
# timeout, so that run trains long enough to still be running then.
@pytest.mark.parametrize(
    ("fault", "env"),
    [(None, SHORT), ("hang", toy_env(steps=400, every=25, step_seconds=0.04))],
    ids=["error", "hang"],
)
def test_a_gpu_fault_moves_the_job_to_another_machine(supervisor, fault, env):
    job = submit(supervisor, env)
    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=0)
    supervisor.sandbox.inject(first.instance_id, "gpu-fault", fault)

    interruption = wait_interruption(first, timeout=60)
    assert interruption.cause == "gpu_fault"
    assert interruption.detail  # nvidia-smi's message or its timeout
    second = wait_running(job, 2)
    assert second.machine_id != first.machine_id
    job.refresh_from_db()
    assert first.machine_id in job.avoid_machine_ids
    wait_until(
        lambda: supervisor.sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the faulty host to be destroyed",
    )
    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


def gpus_of(attempt) -> list[dict]:
    """The GPUs ATTEMPT's latest stored heartbeat listed."""
    attempt.refresh_from_db(fields=["gpus"])
    return attempt.gpus


def test_one_gpu_of_a_two_gpu_host_falling_off_the_bus_moves_the_job_off_that_machine(
    supervisor,
):
    env = SHORT
    two_gpus = {**FIELD_REPORT_REQUIREMENTS, "num_gpus": 2}
    job = submit(supervisor, env, requirements=two_gpus)
    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=0)
    wait_until(
        lambda: [g["index"] for g in gpus_of(first)] == [0, 1],
        timeout=30,
        what="a heartbeat listing both GPUs of the host",
    )
    supervisor.sandbox.inject(first.instance_id, "gpu-fault", "lost:1")

    interruption = wait_interruption(first, timeout=60)
    assert interruption.cause == "gpu_fault"
    # Named by its index, from the readings before it fell off the bus.
    assert interruption.detail.startswith("GPU 1 (0000:02:00.0) is lost: GPU is lost."), (
        interruption.detail
    )
    assert [(g["index"], bool(g["error"])) for g in gpus_of(first)] == [(1, True)]
    second = wait_running(job, 2)
    assert second.machine_id != first.machine_id
    job.refresh_from_db()
    assert first.machine_id in job.avoid_machine_ids
    wait_until(
        lambda: [g["index"] for g in gpus_of(second)] == [0, 1],
        timeout=30,
        what="the new host's heartbeat listing its two GPUs",
    )
    wait_until(
        lambda: supervisor.sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the faulty host to be destroyed",
    )
    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


# ---- 4. stalled training --------------------------------------------------------------------

STALLING = (
    f'{PYTHON} -c \'import time, agent; agent.report(1, total_steps=10); print("stuck"); '
    "time.sleep(600)'"
)


def test_training_that_stops_making_progress_is_a_lost_host(supervisor):
    job = supervisor.submit_toy(command=STALLING, env={}, total_steps=10, stall_timeout_s=2)
    first = wait_running(job, 1)

    interruption = wait_interruption(first, timeout=30)
    assert interruption.cause == "stalled"
    assert interruption.step_reached == 1
    wait_until(
        lambda: job.attempts.filter(number=2).exclude(instance_id=None).exists(),
        timeout=60,
        what="a replacement host",
    )
    wait_until(
        lambda: supervisor.sandbox.status(first.instance_id) is None,
        timeout=30,
        what="the stalled host to be destroyed",
    )
    lifecycle.cancel_job(job.pk, now=timezone.now(), by="the test")
    wait_released(supervisor, job)


# ---- 5. a host that never registers ---------------------------------------------------------


def test_a_replacement_whose_agent_never_registers_is_replaced_too(supervisor, monkeypatch):
    # The replacement host's onstart never gets to start the agent: it stands for an image or
    # model download that hangs. The provider says running all along; only the start timeout
    # can tell. Other attempts get the real bootstrap. Losing a replacement before it ran
    # leaves two interruptions open; the host that finally runs closes both.
    # Only the replacement gets the 3 s start timeout, set as it is rented (before the
    # watchdog first looks at it): the first and third hosts start with the job's own, so a
    # loaded machine's slow agent start is never what this test sees lost.
    real_bootstrap = renting.render_bootstrap
    env = toy_env(steps=120, every=20, step_seconds=0.04)
    job = submit(supervisor, env)
    own_timeout = job.start_timeout_s

    def bootstrap(attempt, *, token):
        timeout = 3 if attempt.number == 2 else own_timeout
        Job.objects.filter(pk=attempt.job_id).update(start_timeout_s=timeout)
        if attempt.number == 2:
            return "echo 'pulling the model (this never finishes)'\nexec sleep 600\n"
        return real_bootstrap(attempt, token=token)

    monkeypatch.setattr(renting, "render_bootstrap", bootstrap)
    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=20)
    supervisor.sandbox.inject(first.instance_id, "destroy")

    second = wait_until(
        lambda: job.attempts.filter(number=2).exclude(instance_id=None).first(),
        timeout=30,
        what="the replacement host to be rented",
    )
    supervisor.sandbox.wait_status(second.instance_id, "running", timeout=20)
    interruption = wait_interruption(second, timeout=30)
    assert interruption.cause == "never_registered"
    second.refresh_from_db()
    assert second.registered_at is None

    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert job.attempts.count() == 3
    interruptions = Interruption.objects.filter(job=job).order_by("detected_at")
    assert [i.attempt.number for i in interruptions] == [1, 2]
    third = job.attempts.get(number=3)
    for each in interruptions:
        # Both recovered when #3's command started, as its agent dated it (its beat's arrival,
        # third.running_at, can come later on a loaded machine).
        back = min(t for t in (third.command_started_at, third.running_at) if t is not None)
        assert each.running_again_at == back
        assert each.resumed_step == third.resumed_from_step > 0
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


# ---- 6. the command fails -------------------------------------------------------------------

FAILING = (
    f'{PYTHON} -c \'import sys; print("loading data"); '
    'print("ValueError: learning rate must be positive", file=sys.stderr); sys.exit(1)\''
)


def test_a_command_that_exits_1_fails_the_job_without_another_host(supervisor):
    job = supervisor.submit_toy(command=FAILING, env={}, total_steps=10)
    wait_state(job, JobState.FAILED, timeout=60)
    attempt = job.attempts.get()
    assert attempt.exit_code == 1
    assert job.failure_reason == "exit code 1"
    failed = job.events.get(kind="failed")
    assert failed.data["exit_code"] == 1
    assert "learning rate must be positive" in failed.data["log_tail"]
    wait_released(supervisor, job)
    wait_ticks(3)  # the watchdog had its chances to re-rent, and did not
    assert job.attempts.count() == 1
    assert not Interruption.objects.filter(job=job).exists()
    assert state_of(job) == JobState.FAILED


# ---- 7. the renting worker dies between create and record --------------------------------------


def test_an_instance_created_by_a_worker_that_died_is_adopted_by_its_label(
    supervisor, settings, monkeypatch
):
    # Long enough that the new host asks for its agent before the adoption (production waits
    # 30 s): the bootstrap is turned away until then and keeps trying.
    settings.ADOPT_AFTER_S = 3
    real_record = lifecycle.mark_rented
    died: list[int] = []

    def mark_rented(attempt_id, **kwargs):
        if not died:  # the worker dies once, after the provider created the instance
            died.append(kwargs["instance_id"])
            raise RuntimeError("worker killed before saving the instance id (test)")
        return real_record(attempt_id, **kwargs)

    monkeypatch.setattr(lifecycle, "mark_rented", mark_rented)
    with InstanceWatch(supervisor.sandbox) as watch:
        job = submit(supervisor, SHORT)
        wait_until(lambda: died, timeout=30, what="the renting worker to die")
        attempt = job.attempts.get()
        assert attempt.state == "requested"
        assert attempt.instance_id is None

        wait_state(job, JobState.SUCCEEDED, timeout=90)
        wait_released(supervisor, job)
    attempt.refresh_from_db()
    assert attempt.instance_id == died[0]
    assert attempt.decision == {"adopted": True}
    assert job.attempts.count() == 1
    assert watch.ids_for(job) == {died[0]}  # one instance ever, the adopted one
    assert watch.peak_for(job) == 1
    assert final_digest_of(job) == toy_digest(SHORT)
    onstart_log = Path(supervisor.sandbox.debug(died[0])["scratch"]) / "onstart.log"
    assert "agent download failed" in onstart_log.read_text(errors="replace")


def test_a_lost_rent_message_is_sent_again(supervisor, monkeypatch):
    # Celery only nudges: a rent message lost on its way (the filesystem broker can drop one
    # whose file it reads before it was written) must not leave the job planned forever.
    real_send = lifecycle.send_task
    dropped: list[int] = []

    def send_task(task_name, *args):
        if task_name == lifecycle.RENT_TASK and not dropped:
            dropped.append(args[0])
            return None
        return real_send(task_name, *args)

    monkeypatch.setattr(lifecycle, "send_task", send_task)
    job = submit(supervisor, SHORT)
    wait_until(lambda: dropped, timeout=10, what="the first rent message to be dropped")
    wait_state(job, JobState.SUCCEEDED, timeout=60)
    assert job.attempts.count() == 1
    assert job.attempts.get().pk == dropped[0]
    wait_released(supervisor, job)


# ---- 8. no offers for a while ---------------------------------------------------------------


def test_a_job_waits_in_renting_without_offers_and_says_so_once(supervisor, settings):
    settings.RENT_BACKOFF_START_S = 1
    settings.RENT_BACKOFF_CAP_S = 1
    unaffordable = {**FIELD_REPORT_REQUIREMENTS, "max_dph": 0.001}
    job = submit(supervisor, SHORT, requirements=unaffordable)

    wait_until(
        lambda: job.attempts.filter(end_reason="no_offers").count() >= 3,
        timeout=30,
        what="three tries to rent without offers",
    )
    assert state_of(job) == JobState.RENTING
    assert job.events.filter(kind="no_offers").count() == 1
    assert not live_instances(supervisor.sandbox, job)

    type(job).objects.filter(pk=job.pk).update(requirements=FIELD_REPORT_REQUIREMENTS)
    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert job.events.filter(kind="no_offers").count() == 1
    assert job.events.filter(kind="rented").count() == 1
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.index("no_offers") < kinds.index("rented")
    wait_released(supervisor, job)


# ---- 9. a 429 storm during recovery ---------------------------------------------------------


def test_recovery_completes_through_a_429_storm(supervisor, settings):
    settings.RENT_BACKOFF_START_S = 2
    env = SHORT  # the storm outlasts the client's retries (~7.5 s): calls really fail
    job = submit(supervisor, env)
    sandbox = supervisor.sandbox
    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=20)

    sandbox.inject(first.instance_id, "destroy")
    sandbox.anon().post("/sandbox/inject", json={"action": "ratelimit", "arg": 8})
    assert sandbox.client().get("/api/v1/instances/").status_code == 429

    interruption = wait_interruption(first, timeout=60)
    # Silence is noticed without the provider's API; the provider says gone once it answers.
    assert interruption.cause in ("heartbeat_timeout", "provider_offline")
    wait_state(job, JobState.SUCCEEDED, timeout=120)
    interruption.refresh_from_db()
    assert interruption.running_again_at is not None
    assert final_digest_of(job) == toy_digest(env)
    wait_released(supervisor, job)


# ---- 10. orphans, and a host that is outbid ----------------------------------------------------


def test_the_reconciler_destroys_a_stray_labelled_instance_and_nothing_else(supervisor, settings):
    settings.ORPHAN_GRACE_S = 1
    sandbox = supervisor.sandbox
    # Training outlasts the reaping and the ticks after it even on a loaded machine (CI once
    # saw SHORT's ~4 s finish first, its host then destroyed as a finished job's is), so the
    # job's own host is seen still running, untouched.
    job = submit(supervisor, toy_env(steps=500, every=50, step_seconds=0.04))  # ~20 s
    attempt = wait_running(job, 1)

    free = [offer["id"] for offer in sandbox.search({"limit": 20})]
    env_name = settings.NOMADGPU_ENV
    stray = sandbox.create(free[0], label=f"ngpu:{env_name}:{job.pk}:7")
    not_ours = sandbox.create(free[1], label="someone-elses-notebook")
    other_env = sandbox.create(free[2], label=f"ngpu:{env_name}-staging:{job.pk}:1")

    wait_until(
        lambda: sandbox.status(stray) is None, timeout=30, what="the stray instance to be reaped"
    )
    assert sandbox.debug(stray)["destroyed_by"] == "user"  # by an API call: the reaper's
    wait_ticks(3)
    assert sandbox.status(not_ours) is not None
    assert sandbox.status(other_env) is not None
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING, attempt.state  # still training: a real check
    assert sandbox.status(attempt.instance_id) == "running"  # the job's own host is untouched
    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert job.attempts.count() == 1
    wait_released(supervisor, job)
    assert sandbox.status(not_ours) is not None


# A container stop gets SIGTERM and SIGKILL after a grace (docker stop); --fast makes that
# grace 0.1 s, too short for the agent to say anything. Scaled to 1 s, the agent reports how
# its command ended before it dies, as it would on Vast (10 s).
@pytest.mark.sandbox_flags("--time-scale", "0.2")
def test_an_outbid_host_is_replaced(supervisor):
    env = toy_env(steps=120, every=20, step_seconds=0.04)
    job = submit(supervisor, env)
    first = wait_running(job, 1)
    wait_checkpoint(job, attempt=first, above=20)
    supervisor.sandbox.inject(first.instance_id, "outbid")

    interruption = wait_interruption(first)
    # The container is stopped: the agent reports its command killed before it dies (a host
    # loss, not the user's bug), or the provider's list shows it stopped first, or, if the
    # grace is too short for either, it falls silent. (An on-demand rental is not a bid, so
    # the provider's "stopped" is read as provider_stopped, not outbid.)
    assert interruption.cause in ("killed", "provider_stopped", "heartbeat_timeout")
    if interruption.cause == "killed":  # it saved and shipped a checkpoint on SIGTERM
        wait_state(job, JobState.RUNNING, JobState.SUCCEEDED)
        interruption.refresh_from_db()
        assert interruption.resumed_step == interruption.step_reached
    wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert final_digest_of(job) == toy_digest(env)
    assert not JobEvent.objects.filter(job=job, kind="failed").exists()
    wait_released(supervisor, job)
