"""The loss rules as plain decisions: which due attempt is lost, and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hosts.vast import Instance, container_runtime_failed, parse_instance
from jobs.models import Attempt, Job
from jobs.watchdog.deadlines import cause_of_due
from jobs.watchdog.instance_status import provider_loss

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def attempt(**fields) -> Attempt:
    job = Job(heartbeat_interval_s=15, stall_timeout_s=600, start_timeout_s=900)
    defaults = {
        "pk": 1,
        "state": "running",
        "registered_at": NOW - timedelta(minutes=10),
        "last_heartbeat_at": NOW - timedelta(seconds=5),
        "running_at": NOW - timedelta(minutes=9),
        "last_progress_at": NOW - timedelta(seconds=20),
        "phase": "running",
        "gpu_ok": True,
    }
    a = Attempt(**{**defaults, **fields})
    a.job = job
    return a


def instance(status: str | None, **fields) -> Instance:
    base = {f: None for f in Instance.__dataclass_fields__ if f not in ("env", "raw")}
    return Instance(**{**base, "id": 9, "actual_status": status, **fields})


def test_never_registered_is_a_loss():
    loss = cause_of_due(attempt(registered_at=None, last_heartbeat_at=None), NOW)

    assert loss.cause == "never_registered"


def test_a_gpu_fault_is_a_loss():
    loss = cause_of_due(attempt(gpu_ok=False, gpu_error="Unknown Error"), NOW)

    assert loss.cause == "gpu_fault"
    assert "Unknown Error" in loss.detail


def test_silence_past_the_timeout_is_a_loss():
    # 15 s beats: the timeout is 1.75 intervals = 26.25 s, inside the two-interval goal.
    loss = cause_of_due(attempt(last_heartbeat_at=NOW - timedelta(seconds=27)), NOW)

    assert loss.cause == "heartbeat_timeout"


def test_a_blip_shorter_than_the_timeout_is_not_a_loss():
    # One lost beat (due at 15 s) retried by the agent a few seconds later is forgiven.
    assert cause_of_due(attempt(last_heartbeat_at=NOW - timedelta(seconds=25)), NOW) is None


def test_no_progress_for_the_stall_timeout_is_a_loss():
    loss = cause_of_due(attempt(last_progress_at=NOW - timedelta(seconds=601)), NOW)

    assert loss.cause == "stalled"


def test_no_progress_while_restoring_is_not_a_stall():
    due = attempt(last_progress_at=NOW - timedelta(hours=1), phase="restoring")

    assert cause_of_due(due, NOW) is None


@pytest.mark.parametrize(
    ("status", "cause"), [("exited", "provider_exited"), ("offline", "provider_offline")]
)
def test_the_provider_saying_exited_or_offline_is_a_loss(status, cause):
    assert provider_loss(attempt(), instance(status)).cause == cause


def test_a_missing_instance_is_a_loss():
    assert provider_loss(attempt(), None).cause == "provider_gone"


def test_unknown_counts_only_on_the_second_poll():
    assert provider_loss(attempt(provider_unknown_polls=0), instance("unknown")) is None
    assert provider_loss(attempt(provider_unknown_polls=1), instance("unknown")).cause == (
        "provider_unknown"
    )


def test_an_outbid_interruptible_instance_is_a_loss_by_vasts_three_stopped_states():
    states = {"cur_state": "stopped", "intended_status": "stopped", "next_state": "stopped"}
    paused = instance("stopped", is_bid=True, **states)
    on_demand = instance("stopped", is_bid=False, status_msg="out of credit", **states)

    assert provider_loss(attempt(), paused).cause == "outbid"
    assert provider_loss(attempt(), on_demand).cause == "provider_stopped"
    assert provider_loss(attempt(), on_demand).detail == "out of credit"


def test_running_and_loading_are_healthy():
    assert provider_loss(attempt(), instance("running")) is None
    assert provider_loss(attempt(state="starting"), instance("loading")) is None


def test_a_contract_end_is_taken_only_when_it_is_a_real_moment_after_the_start():
    from datetime import UTC, datetime

    from jobs.watchdog.instance_status import contract_end

    start = datetime(2026, 12, 1, tzinfo=UTC)
    ends = start + timedelta(days=30)

    assert contract_end(instance("running", start_date=start, end_date=ends)) == ends
    assert contract_end(instance("running", start_date=start, end_date=start)) is None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert contract_end(instance("running", start_date=None, end_date=epoch)) is None
    assert contract_end(None) is None


def test_a_start_timeout_says_what_the_provider_said_first_when_the_container_never_started():
    stuck = attempt(
        registered_at=None,
        last_heartbeat_at=None,
        provider_status="created",
        provider_status_msg="Error response from daemon: ... OCI runtime create failed: runc ...",
    )

    loss = cause_of_due(stuck, NOW)

    assert loss.cause == "never_registered"
    assert loss.detail.startswith(
        "no agent within 900 s: the host could not start the container (its container runtime "
        "failed)"
    )
    assert "the provider shows it created: Error response from daemon" in loss.detail


# Recorded instance bodies (public third-party test fixtures of Vast clients), trimmed to the
# fields the rules read: Vast gave each contract up before its container ran.
CDI_FAILURE = (
    "Error response from daemon: failed to create task for container: failed to create shim "
    "task: OCI runtime create failed: could not apply required modification to OCI "
    "specification: error modifying OCI spec: failed to inject CDI devices: unresolvable CDI "
    "devices"
)
GIVEN_UP = {"cur_state": "stopped", "intended_status": "stopped", "next_state": "stopped"}
HOST_CANNOT_START = {"id": 48738927, "actual_status": "created", "status_msg": CDI_FAILURE}
OUTBID_WHILE_LOADING = {"id": 77, "actual_status": "loading", "is_bid": True}


def recorded(body: dict, **fields) -> Instance:
    return parse_instance({"machine_id": 145651, **GIVEN_UP, **body, **fields})


@pytest.mark.parametrize("is_bid", [False, True])
def test_a_host_that_cannot_start_the_container_is_a_start_failure_at_once(is_bid):
    starting = attempt(state="starting", registered_at=None, last_heartbeat_at=None)

    loss = provider_loss(starting, recorded(HOST_CANNOT_START, is_bid=is_bid))

    assert loss.cause == "start_failed"  # never "outbid": no bid makes this host start it
    assert "unresolvable CDI devices" in loss.detail


def test_a_bid_given_up_while_its_image_loaded_is_outbid():
    loss = provider_loss(attempt(state="starting"), recorded(OUTBID_WHILE_LOADING))

    assert loss.cause == "outbid"


def test_an_on_demand_contract_given_up_before_running_is_lost_without_waiting_for_the_timeout():
    given_up = recorded(OUTBID_WHILE_LOADING, is_bid=False, status_msg=None)

    loss = provider_loss(attempt(state="starting"), given_up)

    assert loss.cause == "provider_stopped"
    assert loss.detail == "Vast stopped the contract before the container ran (loading)"


def test_a_loading_instance_vast_still_means_to_run_is_healthy():
    # cur_state alone reads "stopped" while a healthy image loads (a Vast client's recorded
    # pull in progress); only all three stopped is Vast giving up.
    pulling = parse_instance(
        {
            "id": 1,
            "actual_status": "loading",
            "cur_state": "stopped",
            "intended_status": "running",
            "next_state": "running",
            "status_msg": "0d30c18b26f8: Retrying in 5 seconds",
        }
    )

    assert provider_loss(attempt(state="starting"), pulling) is None


@pytest.mark.parametrize(
    ("status_msg", "failed"),
    [
        (CDI_FAILURE, True),
        ("Error: container failed to start: OCI runtime create failed", True),
        ("nvidia-container-cli: initialization error: driver rpc error: timed out", True),
        ("Error response from daemon: manifest for img:cuda-99 not found", False),  # the image's
        ("error pulling image configuration: download failed after attempts=6", False),
        ("", False),
        (None, False),
    ],
)
def test_a_runtime_failure_is_told_from_the_images_own_trouble(status_msg, failed):
    assert container_runtime_failed(status_msg) is failed
