"""The sandbox marketplace over real HTTP: Vast's API shapes, lifecycle, failures, billing.

Every test talks to a real sandbox process (``tests.support.sandbox``) with raw httpx, the
way the project's client and the official CLI do. Waiting is polling with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.netdev import parse as parse_net_dev
from tests.support.processes import wait_until
from tests.support.sandbox import (
    DEFAULT_KEY,
    FAST_FLAGS,
    ROOT,
    Sandbox,
    market_offers,
)

GB = 1024**3
# The H100 NVL offer: expensive GPU hours and non-zero storage and traffic prices, so a
# few seconds of use give amounts that survive rounding to 3 decimals.
PRICEY_ASK = 17024603
SLEEP_ONSTART = "exec sleep 120\n"


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One sandbox for the read-only search tests."""
    box = Sandbox(tmp_path_factory.mktemp("market") / "state", FAST_FLAGS, (DEFAULT_KEY,)).start()
    yield box
    box.close()


def cheapest_ask(box: Sandbox, **filters: dict) -> int:
    query = {"rentable": {"eq": True}, "order": [["dph_total", "asc"]], "limit": 1, **filters}
    return box.search(query)[0]["id"]


def group_states(pgid: int) -> set[str]:
    """The scheduler states (R, S, T, Z...) of a process group's members, from /proc."""
    states = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            states.add(fields[0])
    return states


def window(start: float, end: float | None = None) -> dict[str, str]:
    """The ``day`` filter for the days from START's through END's (now): Vast keys each day's
    row at 00:00 UTC, so the window starts at START's midnight."""
    first = int(start) // 86_400 * 86_400
    day = {"day": {"gte": first, "lte": int(end or time.time()) + 60}}
    return {"select_filters": json.dumps(day)}


# ---- offer search ---------------------------------------------------------------------------


def test_search_filters_orders_and_limits_like_vast(market: Sandbox):
    query = {
        "gpu_name": {"eq": "RTX 4090"},
        "num_gpus": {"eq": 1},
        "reliability": {"gte": 0.98},
        "inet_down": {"gte": 500},
        "verified": {"eq": True},
        "rentable": {"eq": True},
        "order": [["dph_total", "asc"]],
        "limit": 5,
        "allocated_storage": 50,
        "type": "on-demand",
    }

    offers = market.search(query)

    def total(o: dict) -> float:
        return o["dph_base"] + o["storage_cost"] * 50 / 720

    qualifying = [
        o
        for o in market_offers().values()
        if o["gpu_name"] == "RTX 4090"
        and o["num_gpus"] == 1
        and o["reliability"] >= 0.98
        and o["inet_down"] >= 500
        and o["verification"] == "verified"
        and o["disk_space"] >= 50
    ]
    assert [o["id"] for o in offers] == [o["id"] for o in sorted(qualifying, key=total)[:5]]
    for o in offers:
        assert o["dph_total"] == pytest.approx(total(o))
        assert o["storage_total_cost"] == pytest.approx(o["storage_cost"] * 50 / 720)
        assert o["search"]["totalHour"] == pytest.approx(o["dph_total"])
        assert not [k for k in o if k.startswith("sim_")]


def test_search_ops_virtual_columns_and_aliases(market: Sandbox):
    offers = market_offers()
    names = market.search({"gpu_name": {"in": ["RTX 3090", "A40"]}, "limit": 1000})
    assert {o["gpu_name"] for o in names} == {"RTX 3090", "A40"}
    assert len(names) == sum(o["gpu_name"] in ("RTX 3090", "A40") for o in offers.values())
    assert all(
        1 < o["num_gpus"] <= 4
        for o in market.search({"num_gpus": {"gt": 1, "lte": 4}, "limit": 1000})
    )
    assert all(
        o["hosting_type"] == 1 for o in market.search({"datacenter": {"eq": True}, "limit": 1000})
    )
    assert all(
        o["verification"] != "verified"
        for o in market.search({"verified": {"eq": False}, "limit": 1000})
    )
    canada = market.search({"geolocation": {"eq": "CA"}, "limit": 1000})
    assert canada
    assert all(o["geolocation"].endswith(", CA") for o in canada)
    not_us = market.search({"geolocation": {"notin": ["US"]}, "limit": 1000})
    assert not_us
    assert not [o for o in not_us if o["geolocation"].endswith("US")]
    # The CLI sends values as strings; they compare as the column's type.
    as_cli = market.search(
        {"reliability": {"gt": "0.99"}, "num_gpus": {"eq": "2"}, "verified": {"eq": "True"}}
    )
    assert as_cli
    assert all(o["reliability"] > 0.99 and o["num_gpus"] == 2 for o in as_cli)
    alias = [o["id"] for o in market.search({"reliability2": {"gte": 0.995}, "limit": 1000})]
    assert alias
    assert alias == [o["id"] for o in market.search({"reliability": {"gte": 0.995}, "limit": 1000})]
    drivers = market.search(
        {"driver_version": {"gte": 560000000}, "limit": 1000}
    )  # CLI's numeric form
    assert drivers
    assert all(int(o["driver_version"].split(".")[0]) >= 560 for o in drivers)


def test_search_prices_interruptible_offers_at_the_min_bid(market: Sandbox):
    bid = market.search({"type": "bid", "allocated_storage": 10, "limit": 3})
    ondemand = market.search({"type": "ondemand", "allocated_storage": 10, "limit": 3})

    assert all(
        o["is_bid"] and o["dph_total"] == pytest.approx(o["min_bid"] + o["storage_total_cost"])
        for o in bid
    )
    assert all(
        not o["is_bid"] and o["dph_total"] == pytest.approx(o["dph_base"] + o["storage_total_cost"])
        for o in ondemand
    )


def test_search_answers_post_get_and_put_alike_without_auth(market: Sandbox):
    query = {"num_gpus": {"eq": 4}, "order": [["dph_total", "desc"]], "limit": 7}
    client = market.anon()

    post = client.post("/api/v0/bundles", json=query)
    get = client.get("/api/v0/bundles/", params={"q": json.dumps(query)})
    put = client.put("/api/v0/search/asks/", json={"select_cols": ["*"], "q": query})

    assert post.headers["content-type"] == "application/json"  # the CLI insists on exactly this
    assert [o["id"] for o in post.json()["offers"]] == [o["id"] for o in get.json()["offers"]]
    assert [o["id"] for o in put.json()["offers"]] == [o["id"] for o in post.json()["offers"]]
    assert len(client.post("/api/v0/bundles/", json={}).json()["offers"]) == 64  # default limit


def test_search_rejects_unknown_operators_and_types(market: Sandbox):
    client = market.anon()

    bad_op = client.post("/api/v0/bundles/", json={"num_gpus": {"approx": 1}})
    bad_type = client.post("/api/v0/bundles/", json={"type": "spot"})

    assert bad_op.status_code == 400
    assert bad_op.json()["error"] == "invalid_args"
    assert bad_type.status_code == 400
    assert bad_type.json()["success"] is False


def test_market_file_and_seed_flags(sandbox_factory, tmp_path: Path):
    offers = list(market_offers().values())[:2]
    custom = tmp_path / "two.json"
    custom.write_text(json.dumps(offers))
    small = sandbox_factory("--market", str(custom))
    assert sorted(o["id"] for o in small.search({"limit": 100})) == sorted(o["id"] for o in offers)
    assert not [k for o in small.search({}) for k in o if k.startswith("sim_")]

    seven, again, eight = (sandbox_factory("--seed", s) for s in ("7", "7", "8"))

    def rented(box: Sandbox) -> set[int]:
        return {o["id"] for o in box.search({"rented": {"eq": True}, "limit": 1000})}

    assert rented(seven) == rented(again)
    assert len(rented(seven)) == 36
    assert rented(eight) != rented(seven)
    taken = next(iter(rented(seven)))
    refused = seven.client().put(f"/api/v0/asks/{taken}/", json={"image": "ubuntu"})
    assert refused.status_code == 404
    assert refused.json()["error"] == "invalid_args"  # taken: the hand-written docs' form
    assert "no_such_ask" in refused.json()["msg"]


# ---- renting ----------------------------------------------------------------------------------


def test_a_rented_ask_leaves_the_market_until_destroyed(sandbox: Sandbox):
    ask = cheapest_ask(sandbox)

    iid = sandbox.create(ask)

    assert sandbox.search({"id": {"eq": ask}, "rentable": {"eq": True}}) == []
    assert sandbox.search({"id": {"eq": ask}})[0]["rented"] is True
    second = sandbox.client().put(f"/api/v0/asks/{ask}/", json={"image": "ubuntu"})
    assert second.status_code == 404
    assert second.json() == {
        "success": False,
        "error": "invalid_args",
        "msg": f"error 404/3603: no_such_ask  Instance type by id {ask} is not available.",
        "ask_id": ask,
    }
    assert sandbox.client().delete(f"/api/v0/instances/{iid}/").json()["success"] is True
    assert sandbox.search({"id": {"eq": ask}, "rentable": {"eq": True}})


def test_two_renters_racing_for_one_ask_exactly_one_wins(sandbox_factory):
    box = sandbox_factory(keys=("alice", "bob"))
    ask = cheapest_ask(box)
    clients = [box.client("alice"), box.client("bob")]
    start, results = threading.Barrier(2), []

    def rent(client) -> None:
        start.wait()
        results.append(client.put(f"/api/v0/asks/{ask}/", json={"image": "ubuntu"}))

    threads = [threading.Thread(target=rent, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(r.status_code for r in results) == [200, 404]
    listed = [c.get("/api/v1/instances/").json()["total_instances"] for c in clients]
    assert sorted(listed) == [0, 1]


def test_create_validates_the_body(sandbox_factory):
    box = sandbox_factory()
    broke = sandbox_factory("--credit", "0")
    ask = cheapest_ask(box)
    client = box.client()

    def create(**body) -> dict:
        return client.put(f"/api/v0/asks/{ask}/", json={"image": "x", **body}).json()

    assert client.put(f"/api/v0/asks/{ask}/", json={"disk": 10}).json()["error"] == "invalid_args"
    # Vast's create limits (create_instance.yaml): label 256, onstart + args 4,096, disk >= 8 GB.
    assert "at most 256 characters" in create(label="l" * 257)["msg"]
    assert "at most 4096 together" in create(onstart="x" * 4000, args=["y" * 97])["msg"]
    assert "at least 8 GB" in create(disk=7.5)["msg"]
    assert (
        client.put(f"/api/v0/asks/{ask}/", json={"image": "x", "price": 0}).json()["error"]
        == "invalid_price"
    )
    assert client.put(f"/api/v0/asks/{ask}/", json={"image": "x", "disk": 10**6}).status_code == 400
    assert client.put("/api/v0/asks/1/", json={"image": "x"}).json()["error"] == "no_such_ask"
    no_credit = broke.client().put(f"/api/v0/asks/{ask}/", json={"image": "x"})
    # Create answers 400 invalid_args "for billing issues" (the generated spec).
    assert no_credit.status_code == 400
    assert no_credit.json()["error"] == "invalid_args"
    assert "billing" in no_credit.json()["msg"]


def test_instance_goes_created_loading_running_and_runs_onstart(sandbox: Sandbox):
    ask = cheapest_ask(sandbox)
    offer = market_offers()[ask]
    onstart = (
        'printf "%s|%s|%s|%s" "$CONTAINER_ID" "$VAST_CONTAINERLABEL" "$FOO" "$CONTAINER_API_KEY"'
        " > proof\n"
    )
    reply = sandbox.client().put(
        f"/api/v0/asks/{ask}/",
        json={
            "image": "pytorch/pytorch",
            "disk": 12,
            "label": "life",
            "onstart": onstart + SLEEP_ONSTART,
            "env": {"FOO": "bar", "-p 8000:8000": "1"},
            "runtype": "ssh",
        },
    )
    body = reply.json()
    iid = body["new_contract"]

    assert body["success"] is True
    assert len(body["instance_api_key"]) == 64
    sandbox.wait_status(iid, "running")
    proof = Path(sandbox.debug(iid)["scratch"]) / "proof"
    wait_until(proof.exists, timeout=10, what="onstart to write its proof")
    assert proof.read_text() == f"{iid}|C.{iid}|bar|{body['instance_api_key']}"
    kinds = [e["kind"] for e in sandbox.debug(iid)["events"]]
    assert kinds[:3] == ["created", "loading", "running"]
    shown = (
        sandbox.client()
        .get(f"/api/v0/instances/{iid}/", params={"owner": "me"})
        .json()["instances"]
    )
    assert shown["extra_env"] == [["FOO", "bar"], ["-p 8000:8000", "1"]]
    assert (shown["label"], shown["image_uuid"], shown["disk_space"]) == (
        "life",
        "pytorch/pytorch",
        12,
    )
    assert (shown["intended_status"], shown["cur_state"], shown["is_bid"]) == (
        "running",
        "running",
        False,
    )
    assert shown["dph_base"] == offer["dph_base"]
    assert shown["gpu_name"] == offer["gpu_name"]
    assert shown["start_date"] == pytest.approx(time.time(), abs=30)
    assert "ports" in shown


def test_fake_nvidia_smi_reports_the_gpus_and_fails_on_gpu_fault(sandbox: Sandbox):
    ask = cheapest_ask(sandbox, num_gpus={"eq": 2}, gpu_name={"eq": "RTX 3090"})
    gpu_ram = market_offers()[ask]["gpu_ram"]
    onstart = (
        "command -v nvidia-smi > which\n"
        "nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total,temperature.gpu"
        " --format=csv,noheader,nounits > query.tmp && mv query.tmp query\n"
    )
    iid = sandbox.create(ask, onstart=onstart + SLEEP_ONSTART)
    scratch = Path(sandbox.debug(iid)["scratch"])
    tool = scratch / "bin" / "nvidia-smi"

    wait_until((scratch / "query").exists, timeout=10, what="onstart to query the GPUs")
    assert (scratch / "which").read_text().strip() == str(tool)
    lines = (scratch / "query").read_text().splitlines()
    assert lines == [f"NVIDIA GeForce RTX 3090, 0, 0, {gpu_ram}, 34"] * 2
    subset = subprocess.run(
        [tool, "--query-gpu=memory.total,name", "--format=csv"], capture_output=True, text=True
    )
    assert subset.stdout.splitlines()[:2] == [
        "memory.total [MiB], name",
        f"{gpu_ram} MiB, NVIDIA GeForce RTX 3090",
    ]

    sandbox.inject(iid, "gpu-fault")
    failed = subprocess.run(
        [tool, "--query-gpu=name", "--format=csv"], capture_output=True, text=True
    )
    assert failed.returncode == 255
    assert (
        "Unable to determine the device handle for GPU 0000:01:00.0: Unknown Error" in failed.stdout
    )

    sandbox.inject(iid, "gpu-fault", "hang")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([tool, "-L"], capture_output=True, timeout=1.0)
    sandbox.inject(iid, "gpu-fault", "clear")
    assert subprocess.run([tool, "-L"], capture_output=True).returncode == 0


def test_fake_nvidia_smi_lists_each_gpu_and_one_can_fall_off_the_bus(sandbox: Sandbox):
    ask = cheapest_ask(sandbox, num_gpus={"eq": 2}, gpu_name={"eq": "RTX 3090"})
    gpu_ram = market_offers()[ask]["gpu_ram"]
    iid = sandbox.create(ask, onstart=SLEEP_ONSTART)
    tool = Path(sandbox.debug(iid)["scratch"]) / "bin" / "nvidia-smi"
    query = [
        tool,
        "--query-gpu=index,pci.bus_id,name,ecc.errors.uncorrected.volatile.total",
        "--format=csv,noheader,nounits",
    ]

    listed = subprocess.run(query, capture_output=True, text=True)
    assert listed.stdout.splitlines() == [
        "0, 00000000:01:00.0, NVIDIA GeForce RTX 3090, [N/A]",  # GeForce: no ECC
        "1, 00000000:02:00.0, NVIDIA GeForce RTX 3090, [N/A]",
    ]
    assert gpu_ram > 0

    sandbox.inject(iid, "gpu-fault", "lost:1")
    lost = subprocess.run(query, capture_output=True, text=True)
    assert lost.returncode == 15  # NVML_ERROR_GPU_IS_LOST
    assert lost.stdout.splitlines() == [
        "Unable to determine the device handle for GPU0000:02:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU"
    ]  # the healthy GPU 0 is not listed either, as with the real tool
    assert sandbox.debug(iid)["gpu_fault"] == "lost:1"

    for bad in ("lost:2", "lost:x", "lost"):
        reply = sandbox.anon().post(
            f"/sandbox/inject/{iid}", json={"action": "gpu-fault", "arg": bad}
        )
        assert reply.status_code == 400, bad
        assert "lost:N" in reply.text
    sandbox.inject(iid, "gpu-fault", "clear")
    assert subprocess.run(query, capture_output=True).returncode == 0


def test_onstart_ending_marks_an_args_instance_exited(sandbox: Sandbox):
    # runtype args: the container runs the command itself, and ends with it.
    iid = sandbox.create(cheapest_ask(sandbox), onstart="echo bye\nexit 3\n", runtype="args")

    sandbox.wait_status(iid, "exited")

    shown = sandbox.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert "code 3" in shown["status_msg"]
    assert sandbox.debug(iid)["billing_now"] == ["disk"]  # the GPU is released, the disk is not
    assert "bye" in (Path(sandbox.debug(iid)["scratch"]) / "onstart.log").read_text()


def test_an_ssh_instance_stays_running_after_onstart_and_everything_it_started_ended(
    sandbox: Sandbox,
):
    # Vast's ssh entrypoint keeps the container up: only a heartbeat could tell the agent died.
    iid = sandbox.create(
        cheapest_ask(sandbox), onstart="echo bye\nexit 3\n", runtype="ssh_direc ssh_proxy"
    )
    wait_until(
        lambda: "onstart exited with code 3" in {e["kind"] for e in sandbox.debug(iid)["events"]},
        timeout=10,
        what="onstart to end",
    )

    assert sandbox.status(iid) == "running"
    assert sandbox.debug(iid)["processes"] == []
    assert sandbox.debug(iid)["billing_now"] == ["disk", "gpu"]  # and the GPU is still billed


def test_an_expired_contract_is_stopped_and_cannot_start_again(running):
    box, iid = running
    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert shown["end_date"] > time.time()
    assert shown["duration"] > 0

    box.inject(iid, "age", shown["duration"] + 5)  # its end_date is now five seconds ago
    box.wait_status(iid, "stopped", timeout=10)

    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert "contract expired" in shown["status_msg"]
    assert shown["duration"] == 0
    again = box.client().put(f"/api/v0/instances/{iid}/", json={"state": "running"})
    assert again.status_code == 400
    assert "contract expired" in again.json()["msg"]
    assert box.debug(iid)["billing_now"] == ["disk"]


def test_a_container_the_host_cannot_create_is_given_up_while_it_still_shows_created(running):
    box, iid = running

    box.inject(iid, "oci-fail")

    # As a recorded body shows it: the three states stopped, actual_status left at created.
    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    states = (shown["cur_state"], shown["intended_status"], shown["next_state"])
    assert (shown["actual_status"], states) == ("created", ("stopped",) * 3)
    assert "OCI runtime create failed" in shown["status_msg"]
    assert "unresolvable CDI devices" in shown["status_msg"]
    assert box.debug(iid)["billing_now"] == ["disk"]
    assert box.debug(iid)["processes"] == []


def test_background_work_keeps_the_container_up_after_onstart_returns(sandbox: Sandbox):
    iid = sandbox.create(
        cheapest_ask(sandbox), onstart="sleep 120 &\necho started > leader-done\n", runtype="args"
    )
    scratch = Path(sandbox.debug(iid)["scratch"])
    wait_until((scratch / "leader-done").exists, timeout=10, what="the onstart script to finish")
    pgid = sandbox.debug(iid)["pgid"]
    wait_until(
        lambda: group_states(pgid) == {"S"}, timeout=5, what="only the background sleep to remain"
    )

    assert sandbox.status(iid) == "running"
    os.killpg(pgid, 9)
    sandbox.wait_status(iid, "exited")


def test_destroy_kills_the_processes_and_forgets_the_instance(sandbox: Sandbox):
    iid = sandbox.create(cheapest_ask(sandbox), onstart=SLEEP_ONSTART)
    sandbox.wait_status(iid, "running")
    pgid = sandbox.debug(iid)["pgid"]
    client = sandbox.client()

    assert client.delete(f"/api/v0/instances/{iid}/").json()["success"] is True

    wait_until(lambda: not group_states(pgid), timeout=5, what="the process group to die")
    assert client.get(f"/api/v0/instances/{iid}/").json() == {"instances": None}
    assert client.get("/api/v1/instances/").json()["total_instances"] == 0
    gone = client.delete(f"/api/v0/instances/{iid}/")
    assert gone.status_code == 404
    assert gone.json()["error"] == "no_such_instance"
    assert sandbox.debug(iid)["billing_now"] == []


def test_destroy_and_freeze_reach_processes_that_left_the_onstart_group(sandbox: Sandbox):
    # The agent starts training in a new session; a container's end must still take it along.
    onstart = "setsid sleep 300 &\necho $! > escaped.pid\nexec sleep 300\n"
    iid = sandbox.create(cheapest_ask(sandbox), onstart=onstart)
    sandbox.wait_status(iid, "running")
    pid_file = Path(sandbox.debug(iid)["scratch"]) / "escaped.pid"
    escaped = int(
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            timeout=5,
            what="the escaped pid",
        )
    )

    sandbox.inject(iid, "freeze")
    wait_until(lambda: process_state(escaped) == "T", timeout=5, what="the escaped process to stop")
    sandbox.inject(iid, "destroy")

    wait_until(lambda: process_state(escaped) in (None, "Z"), timeout=5, what="it to die")


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return None


def test_label_stop_and_start(sandbox: Sandbox):
    iid = sandbox.create(cheapest_ask(sandbox), onstart=SLEEP_ONSTART)
    sandbox.wait_status(iid, "running")
    client = sandbox.client()

    assert client.put(f"/api/v0/instances/{iid}/", json={"label": "renamed"}).json() == {
        "success": True
    }
    assert client.put(f"/api/v0/instances/{iid}/", json={"label": "x" * 1025}).status_code == 400
    assert (
        client.put(f"/api/v0/instances/{iid}/", json={"state": "stopped"}).json()["success"] is True
    )
    shown = client.get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert (shown["label"], shown["actual_status"], shown["intended_status"]) == (
        "renamed",
        "stopped",
        "stopped",
    )
    assert sandbox.debug(iid)["billing_now"] == ["disk"]

    assert (
        client.put(f"/api/v0/instances/{iid}/", json={"state": "running"}).json()["success"] is True
    )
    sandbox.wait_status(iid, "running")
    assert sandbox.debug(iid)["runs"] == 2  # the container started again: onstart ran again


def test_interruptible_instances_bill_the_bid(sandbox: Sandbox):
    offer = next(o for o in sandbox.search({"limit": 100}) if o["min_bid"] < o["dph_base"] - 0.01)
    bid = round(offer["min_bid"] + 0.005, 4)

    iid = sandbox.create(offer["id"], price=bid)
    sandbox.wait_status(iid, "running")
    shown = sandbox.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert shown["is_bid"] is True
    assert shown["dph_base"] == bid

    low = sandbox.search({"min_bid": {"gt": 0.01}, "rentable": {"eq": True}, "limit": 1})[0]
    reply = sandbox.client().put(
        f"/api/v0/asks/{low['id']}/",
        json={"image": "ubuntu", "price": round(low["min_bid"] / 2, 4)},
    )
    # Created, but stopped: success false with the new contract (Vast's generated spec).
    assert reply.status_code == 200
    assert reply.json()["success"] is False
    under = reply.json()["new_contract"]
    shown = sandbox.client().get(f"/api/v0/instances/{under}/").json()["instances"]
    states = (shown["cur_state"], shown["intended_status"], shown["next_state"])
    assert (shown["actual_status"], states) == ("stopped", ("stopped",) * 3)
    assert "outbid" in shown["status_msg"]


# ---- lists and paging ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, list[int], float]]:
    """105 instances (no onstart) with labels l0/l1/l2, for paging tests."""
    box = Sandbox(tmp_path_factory.mktemp("crowded") / "state", FAST_FLAGS, (DEFAULT_KEY,)).start()
    began = time.time()
    asks = [o["id"] for o in box.search({"order": [["id", "asc"]], "limit": 105})]
    ids = [box.create(ask, label=f"l{n % 3}") for n, ask in enumerate(asks)]
    yield box, ids, began
    box.close()


def test_instance_list_pages_25_at_a_time(crowded):
    box, ids, _ = crowded
    client, seen, token, pages = box.client(), [], None, []
    while True:
        params = {"select_filters": "{}", "order_by": json.dumps([{"col": "id", "dir": "asc"}])}
        page = client.get(
            "/api/v1/instances/", params=params | ({"after_token": token} if token else {})
        ).json()
        pages.append(page["instances_found"])
        seen += [i["id"] for i in page["instances"]]
        assert page["total_instances"] == 105
        assert page["label_counts"] == {"l0": 35, "l1": 35, "l2": 35}
        token = page["next_token"]
        if token is None:
            break

    assert pages == [25, 25, 25, 25, 5]
    assert seen == sorted(ids)


def test_instance_list_filters_orders_and_clamps_limits(crowded):
    box, ids, _ = crowded
    client = box.client()

    def get(**params) -> dict:
        return client.get(
            "/api/v1/instances/", params={k: json.dumps(v) for k, v in params.items()}
        ).json()

    labelled = get(select_filters={"label": {"eq": "l1"}})
    assert labelled["total_instances"] == 35
    assert {i["label"] for i in labelled["instances"]} == {"l1"}
    assert get(select_filters={"id": {"in": ids[:3]}})["total_instances"] == 3
    assert get(order_by=[{"col": "id", "dir": "desc"}])["instances"][0]["id"] == max(ids)
    assert get(limit=100)["instances_found"] == 25
    assert get(limit=0)["instances_found"] == 5
    assert get(select_cols=["id", "label", "nope"])["instances"][0] == {
        "id": min(ids),
        "label": "l0",
        "nope": None,
    }
    computed = client.get(
        "/api/v1/instances/", params={"select_filters": json.dumps({"dph_total": {"lt": 1}})}
    )
    assert computed.status_code == 400
    assert computed.json()["error"] == "invalid_request"
    bad = client.get("/api/v1/instances/", params={"after_token": "not-a-token"})
    assert bad.status_code == 400
    assert bad.json()["error"] == "invalid_token"
    gone = client.get("/api/v0/instances/")
    assert gone.status_code == 410


def test_charges_page_100_contracts_then_the_rest(crowded):
    box, ids, began = crowded
    client = box.client()

    first = client.get("/api/v0/charges/", params=window(began)).json()
    rest = client.get(
        "/api/v0/charges/", params=window(began) | {"after_token": first["next_token"]}
    ).json()

    assert (first["count"], first["total"], rest["count"], rest["next_token"]) == (
        100,
        105,
        5,
        None,
    )
    sources = [r["source"] for r in first["results"] + rest["results"]]
    assert sorted(sources) == sorted(f"instance-{i}" for i in ids)
    assert (
        client.get("/api/v0/charges/", params=window(began) | {"limit": 500}).json()["count"] == 105
    )
    assert client.get("/api/v0/charges/", params=window(began) | {"limit": 7}).json()["count"] == 7
    result = first["results"][0]
    assert {i["type"] for i in result["items"]} <= {"gpu", "disk", "bwd", "bwu"}
    assert result["type"] == "instance"
    assert result["metadata"]["label"] in ("l0", "l1", "l2")


def test_keyset_paging_neither_repeats_nor_skips_when_rows_vanish(sandbox: Sandbox):
    asks = [o["id"] for o in sandbox.search({"order": [["id", "asc"]], "limit": 27})]
    ids = [sandbox.create(ask) for ask in asks]
    client = sandbox.client()

    first = client.get("/api/v1/instances/").json()
    client.delete(f"/api/v0/instances/{ids[0]}/")
    second = client.get("/api/v1/instances/", params={"after_token": first["next_token"]}).json()

    assert [i["id"] for i in first["instances"]] == ids[:25]
    assert [i["id"] for i in second["instances"]] == ids[25:]


# ---- auth and rate limits ------------------------------------------------------------------------


def test_auth_failures_differ_per_endpoint_as_on_vast(sandbox_factory):
    box = sandbox_factory(keys=("owner", "other"))
    ask = cheapest_ask(box)
    reply = box.client("owner").put(f"/api/v0/asks/{ask}/", json={"image": "ubuntu"}).json()
    iid, instance_key = reply["new_contract"], reply["instance_api_key"]
    anon, wrong = box.anon(), box.client("wrong-key")
    billing_window = window(time.time())

    for client in (anon, wrong):
        for method, path in (
            ("GET", "/api/v1/instances/"),
            ("GET", f"/api/v0/instances/{iid}/"),
            ("PUT", f"/api/v0/asks/{ask}/"),
            ("GET", "/api/v0/users/current"),
        ):
            r = client.request(method, path, json={} if method == "PUT" else None)
            assert (r.status_code, r.json()["error"], r.json()["msg"]) == (
                401,
                "auth_error",
                "Invalid user key",
            )
    for path in ("/api/v0/charges/", "/api/v1/invoices/"):
        assert anon.get(path, params=billing_window).status_code == 403
        assert anon.get(path).json()["msg"] == "This action requires login."
        assert (wrong.get(path).status_code, wrong.get(path).json()["error"]) == (404, "auth_error")
    assert anon.post("/api/v0/bundles/", json={}).status_code == 200
    assert (
        anon.get("/api/v1/instances/", params={"api_key": "owner"}).json()["total_instances"] == 1
    )
    # Another account neither sees nor destroys it.
    assert box.client("other").get(f"/api/v0/instances/{iid}/").json() == {"instances": None}
    assert box.client("other").delete(f"/api/v0/instances/{iid}/").status_code == 404
    # The instance's own key reaches that instance and nothing else.
    own = box.client(instance_key)
    assert own.get(f"/api/v0/instances/{iid}/").json()["instances"]["id"] == iid
    assert own.get("/api/v1/instances/").status_code == 401
    assert own.delete(f"/api/v0/instances/{iid}/").json()["success"] is True


def test_rate_limits_answer_429_per_endpoint_and_identity(sandbox_factory):
    box = sandbox_factory(relaxed=False, keys=("sandbox-key", "other"))
    client = box.client()

    assert client.get("/api/v1/instances/").status_code == 200
    limited = client.get("/api/v1/instances/")

    assert limited.status_code == 429
    # --fast scales Vast's 1 s interval like every other duration (Timing.rate_interval).
    assert limited.text == "API requests too frequent: endpoint threshold=0.25"
    assert "retry-after" not in limited.headers
    assert box.client("other").get("/api/v1/instances/").status_code == 200  # another identity
    assert client.get("/api/v0/users/current").status_code == 200  # another endpoint
    wait_until(
        lambda: client.get("/api/v1/instances/").status_code == 200,
        timeout=5,
        what="the interval to pass",
    )
    anon = box.anon()
    assert anon.post("/api/v0/bundles/", json={"limit": 1}).status_code == 200
    assert anon.post("/api/v0/bundles/", json={"limit": 1}).text.endswith("threshold=0.5")


# ---- restart -------------------------------------------------------------------------------------


def test_state_survives_a_restart_and_a_crash(sandbox: Sandbox):
    ask = cheapest_ask(sandbox)
    iid = sandbox.create(ask, label="keep", onstart="echo run >> runs\n" + SLEEP_ONSTART)
    runs = Path(sandbox.debug(iid)["scratch"]) / "runs"
    wait_until(
        lambda: runs.exists() and runs.read_text() == "run\n", timeout=10, what="the first run"
    )
    began = sandbox.debug(iid)["events"][0]["ts"]

    sandbox.restart()  # SIGTERM: the hosts power off with it and reboot on start

    wait_until(lambda: runs.read_text() == "run\nrun\n", timeout=10, what="onstart to run again")
    sandbox.wait_status(iid, "running")
    assert "host restarted" in [e["kind"] for e in sandbox.debug(iid)["events"]]
    client = sandbox.client()
    assert client.get("/api/v1/instances/").json()["label_counts"] == {"keep": 1}
    assert (
        client.get("/api/v0/charges/", params=window(began)).json()["results"][0]["source"]
        == f"instance-{iid}"
    )
    assert sandbox.create(cheapest_ask(sandbox)) == iid + 1
    pgid = sandbox.debug(iid)["pgid"]

    sandbox.restart(crash=True)  # SIGKILL: the processes outlive the sandbox and are adopted

    assert (sandbox.debug(iid)["pgid"], sandbox.debug(iid)["runs"]) == (pgid, 2)
    assert sandbox.status(iid) == "running"
    assert group_states(pgid)
    assert (
        client.get(
            "/api/v1/invoices/",
            params={"select_filters": json.dumps({"when": {"gte": 0, "lte": 2e9}})},
        ).json()["total"]
        == 1
    )


# ---- injected failures -------------------------------------------------------------------


@pytest.fixture
def running(sandbox: Sandbox) -> tuple[Sandbox, int]:
    """A running instance whose onstart counts its runs and then sleeps."""
    iid = sandbox.create(cheapest_ask(sandbox), onstart="echo run >> runs\n" + SLEEP_ONSTART)
    sandbox.wait_status(iid, "running")
    wait_until(lambda: sandbox.debug(iid)["pgid"], timeout=5, what="the onstart process")
    return sandbox, iid


def test_injected_destroy_is_a_vanished_host_listed_offline_until_the_renter_destroys_it(running):
    box, iid = running
    ask, pgid = box.debug(iid)["ask_id"], box.debug(iid)["pgid"]

    box.inject(iid, "destroy")

    wait_until(lambda: not group_states(pgid), timeout=5, what="the processes to die with the host")
    # A host cannot delete a renter's instance: it is still there, offline.
    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert (shown["actual_status"], shown["status_msg"]) == ("offline", "host unreachable")
    assert box.client().get("/api/v1/instances/").json()["total_instances"] == 1
    assert box.search({"id": {"eq": ask}}) == []  # the host is gone from the market too
    assert box.debug(iid)["billing_now"] == []  # offline: no GPU, no storage (Vast's billing)
    assert box.debug(iid)["destroyed_by"] is None

    assert box.client().delete(f"/api/v0/instances/{iid}/").json()["success"] is True
    assert box.client().get(f"/api/v0/instances/{iid}/").json() == {"instances": None}
    assert box.debug(iid)["destroyed_by"] == "user"
    assert box.debug(iid)["billing_now"] == []


def test_a_rebooted_host_shows_offline_then_comes_back_with_its_disk_and_runs_onstart_again(
    running,
):
    box, iid = running
    pgid = box.debug(iid)["pgid"]
    scratch = Path(box.debug(iid)["scratch"])
    (scratch / "on-disk").write_text("kept")
    pulled = box.debug(iid)["usage"]["down_bytes"]

    box.inject(iid, "reboot-host", 1.5)

    wait_until(lambda: not group_states(pgid), timeout=5, what="the processes to die in the reboot")
    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert shown["actual_status"] == "offline"
    assert box.debug(iid)["billing_now"] == []  # offline: no GPU, no storage (Vast's billing)
    box.wait_status(iid, "running", timeout=15)
    debug = box.debug(iid)
    kinds = [e["kind"] for e in debug["events"]]
    assert kinds[-4:] == ["host rebooting, back in 1.5 s", "host back online", "loading", "running"]
    assert debug["billing_now"] == ["disk", "gpu"]
    wait_until(
        lambda: (scratch / "runs").read_text().count("run") == 2,
        timeout=10,
        what="onstart to run again in the restarted container",
    )
    assert (scratch / "on-disk").read_text() == "kept"  # the disk survived the reboot
    assert box.debug(iid)["usage"]["down_bytes"] == pulled  # the image was not pulled again


def test_a_rebooted_host_that_never_returns_stays_offline_until_destroyed(running):
    box, iid = running

    box.inject(iid, "reboot-host", "never")

    assert box.status(iid) == "offline"
    assert box.debug(iid)["host_returns_at"] is None
    assert box.client().delete(f"/api/v0/instances/{iid}/").json()["success"] is True
    assert box.client().get(f"/api/v0/instances/{iid}/").json() == {"instances": None}
    assert box.debug(iid)["billing_now"] == []


def test_a_rebooted_hosts_return_time_is_drawn_from_the_seed(sandbox_factory):
    # Under --fast (scale 0.01) a mean of 60 s is 0.6 s: the same seed, the same draw.
    def drawn(box: Sandbox) -> str:
        iid = box.create(cheapest_ask(box), onstart=SLEEP_ONSTART)
        box.wait_status(iid, "running")
        box.inject(iid, "reboot-host")
        said = [e["kind"] for e in box.debug(iid)["events"] if e["kind"].startswith("host reb")]
        box.close()
        return said[-1]

    flags = ("--seed", "11", "--host-return-p", "1", "--host-return-mean-s", "60")
    first, again = drawn(sandbox_factory(*flags)), drawn(sandbox_factory(*flags))
    assert first == again
    assert first.startswith("host rebooting, back in ")
    never = drawn(sandbox_factory("--seed", "11", "--host-return-p", "0"))
    assert never == "host rebooting"  # no return time: this host never comes back


def test_freeze_stops_the_processes_and_thaw_resumes_them(running):
    box, iid = running
    pgid = box.debug(iid)["pgid"]

    box.inject(iid, "freeze")
    wait_until(lambda: group_states(pgid) == {"T"}, timeout=5, what="SIGSTOP")
    assert box.status(iid) == "running"  # a partitioned host still looks alive to Vast
    assert box.debug(iid)["billing_now"] == ["disk", "gpu"]

    box.inject(iid, "thaw")
    wait_until(lambda: "T" not in group_states(pgid), timeout=5, what="SIGCONT")


def test_a_destroy_sent_to_a_frozen_host_reaches_its_processes_only_after_thaw(running):
    box, iid = running
    pgid = box.debug(iid)["pgid"]
    box.inject(iid, "freeze")
    wait_until(lambda: group_states(pgid) == {"T"}, timeout=5, what="SIGSTOP")

    assert box.client().delete(f"/api/v0/instances/{iid}/").json()["success"] is True

    assert box.client().get(f"/api/v0/instances/{iid}/").json() == {"instances": None}
    queued = box.debug(iid)
    assert queued["billing_now"] == []
    assert queued["destroy_queued"] is True
    assert {p["state"] for p in queued["processes"]} == {"T"}
    assert group_states(pgid) == {"T"}  # still there, stopped: the host never heard of it
    box.inject(iid, "thaw", 2)
    wait_until(lambda: "T" not in group_states(pgid), timeout=5, what="the host to wake up")
    wait_until(lambda: not group_states(pgid), timeout=10, what="the queued destroy to arrive")
    kinds = [e["kind"] for e in box.debug(iid)["events"]]
    assert kinds[-1] == "queued destroy delivered"
    assert box.debug(iid)["destroy_queued"] is False


def test_offline_host_shows_offline_and_bills_nothing(running):
    box, iid = running
    pgid = box.debug(iid)["pgid"]

    box.inject(iid, "offline")

    assert box.status(iid) == "offline"
    assert box.debug(iid)["billing_now"] == []
    wait_until(lambda: group_states(pgid) == {"T"}, timeout=5, what="the host to be cut off")
    box.inject(iid, "online")
    assert box.status(iid) == "running"
    assert box.debug(iid)["billing_now"] == ["disk", "gpu"]
    wait_until(lambda: "T" not in group_states(pgid), timeout=5, what="the host to come back")


def test_slow_factor_reaches_the_instance_times_the_hidden_speed(running):
    box, iid = running
    hidden = market_offers()[box.debug(iid)["ask_id"]]["sim_speed_factor"]
    slow = Path(box.debug(iid)["scratch"]) / "slow"
    assert float(slow.read_text()) == pytest.approx(hidden, abs=1e-4)

    box.inject(iid, "slow", 1.5)

    assert float(slow.read_text()) == pytest.approx(1.5 * hidden, abs=1e-4)


def test_outbid_pauses_the_instance_until_its_bid_wins_again(running):
    box, iid = running
    pgid = box.debug(iid)["pgid"]

    box.inject(iid, "outbid")

    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    # As dstack sees outbid instances on Vast: all three states read stopped.
    states = (shown["cur_state"], shown["intended_status"], shown["next_state"])
    assert (shown["actual_status"], states) == ("stopped", ("stopped",) * 3)
    assert box.debug(iid)["billing_now"] == ["disk"]
    wait_until(lambda: not group_states(pgid), timeout=5, what="the container to stop")
    box.inject(iid, "outbid", "end")
    box.wait_status(iid, "running")
    assert box.debug(iid)["runs"] == 2


def test_an_outbid_while_the_image_loads_leaves_it_loading_under_three_stopped_states(
    sandbox_factory,
):
    # Real time halved, no other tenants and a fixed min_bid: loading lasts seconds.
    # A fixed 3 s of scheduling: the drawn minutes of Vast's would outlast the wait for loading.
    timing = ("--time-scale", "0.5", "--scheduling-s", "3")
    box = sandbox_factory(
        *timing, "--outbid-rate-per-h", "0", "--min-bid-step-pct", "0", fast=False
    )
    offer = box.search({"min_bid": {"gt": 0.01}, "rentable": {"eq": True}, "limit": 1})[0]
    iid = box.create(offer["id"], price=round(offer["min_bid"] + 0.01, 4), onstart=SLEEP_ONSTART)
    box.wait_status(iid, "loading", timeout=15)

    box.inject(iid, "outbid")

    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    states = (shown["cur_state"], shown["intended_status"], shown["next_state"])
    assert (shown["actual_status"], states) == ("loading", ("stopped",) * 3)
    assert "outbid" in shown["status_msg"]
    assert box.debug(iid)["billing_now"] == ["disk"]
    assert "outbid while loading" in [e["kind"] for e in box.debug(iid)["events"]]
    box.inject(iid, "outbid", "end")  # the higher bidder leaves: the image loads again
    box.wait_status(iid, "running", timeout=30)
    assert box.debug(iid)["runs"] == 1


def test_reboot_restarts_the_container_and_reruns_onstart(running):
    box, iid = running
    runs = Path(box.debug(iid)["scratch"]) / "runs"

    box.inject(iid, "reboot")

    wait_until(lambda: runs.read_text() == "run\nrun\n", timeout=10, what="onstart to run again")
    kinds = [e["kind"] for e in box.debug(iid)["events"]]
    assert kinds[-3:] == ["rebooting", "loading", "running"]


def test_overcharge_bills_above_usage(running):
    box, iid = running
    client = box.client()
    wait_until(lambda: box.debug(iid)["usage"]["gpu_s"] > 0.3, timeout=5, what="some GPU time")
    client.delete(f"/api/v0/instances/{iid}/")
    topup = 100.0
    spent = topup - client.get("/api/v0/users/current").json()["credit"]

    box.inject(iid, "overcharge", 50)

    overspent = topup - client.get("/api/v0/users/current").json()["credit"]
    assert overspent == pytest.approx(1.5 * spent, rel=1e-9)


def test_ratelimit_injection_answers_429_for_a_while(sandbox: Sandbox):
    anon = sandbox.anon()

    assert anon.post("/sandbox/inject", json={"action": "ratelimit", "arg": 1.0}).status_code == 200

    blocked = anon.post("/api/v0/bundles/", json={"limit": 1})
    assert (blocked.status_code, blocked.text) == (429, "API requests too frequent")
    wait_until(
        lambda: anon.post("/api/v0/bundles/", json={}).status_code == 200,
        timeout=5,
        what="the block to end",
    )


def test_inject_command_line_calls_the_http_endpoint(running):
    box, iid = running
    env = {**os.environ, "SANDBOX_URL": box.url}

    module = subprocess.run(
        [sys.executable, "-m", "sandbox", "inject", "offline", str(iid)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert module.returncode == 0, module.stderr
    assert box.status(iid) == "offline"
    django = subprocess.run(
        [sys.executable, "manage.py", "sandbox", "inject", "online", str(iid), "--url", box.url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert django.returncode == 0, django.stderr
    assert box.status(iid) == "running"


# ---- billing -----------------------------------------------------------------------------


def test_billing_matches_the_offers_rates(sandbox: Sandbox):
    """Amounts are checked two ways. The account's credit is not rounded, so it must equal
    rate * time (from the sandbox's own transition times) + bytes * $/GB to 1e-9. Charge
    amounts are rounded to 3 decimals as Vast rounds them, so each may differ by 0.0005."""
    offer, disk = market_offers()[PRICEY_ASK], 200
    client = sandbox.client()
    credit_before = client.get("/api/v0/users/current").json()["credit"]
    t_create = time.time()
    iid = sandbox.create(PRICEY_ASK, disk=disk)
    sandbox.wait_status(iid, "running")
    t_seen_running = time.time()
    down, up = 64 * 1024**2, 32 * 1024**2
    assert (
        len(sandbox.anon().get(f"/sandbox/download/{iid}", params={"bytes": down}).content) == down
    )
    assert sandbox.anon().put(f"/sandbox/upload/{iid}", content=b"x" * up).json()["received"] == up
    wait_until(
        lambda: sandbox.debug(iid)["usage"]["gpu_s"] >= 2.0, timeout=10, what="two seconds of GPU"
    )
    t_delete = time.time()
    client.delete(f"/api/v0/instances/{iid}/")

    info = sandbox.debug(iid)
    at = {e["kind"]: e["ts"] for e in info["events"]}
    created, started, destroyed = at["created"], at["running"], at["destroyed by user"]
    assert t_create <= created <= started <= t_seen_running <= t_delete <= destroyed <= time.time()
    expected = {
        "gpu": offer["dph_base"] * (destroyed - started) / 3600,
        "disk": offer["storage_cost"] * disk / 720 * (destroyed - created) / 3600,
        "bwd": (info["image_bytes"] + down) / GB * offer["inet_down_cost"],
        "bwu": up / GB * offer["inet_up_cost"],
    }
    spent = credit_before - client.get("/api/v0/users/current").json()["credit"]
    assert spent == pytest.approx(sum(expected.values()), abs=1e-9)

    charge = client.get("/api/v0/charges/", params=window(t_create)).json()["results"][0]
    items = {i["type"]: i for i in charge["items"]}
    for kind, amount in expected.items():
        assert items[kind]["amount"] == pytest.approx(amount, abs=0.0005 + 1e-9)
    assert charge["amount"] == pytest.approx(sum(expected.values()), abs=0.0005 + 1e-9)
    hours = float(re.match(r"([\d.]+) hours at \$([\d.]+)/hour", items["gpu"]["description"])[1])
    assert hours == pytest.approx((destroyed - started) / 3600, abs=0.0005)
    assert f"at ${offer['dph_base']:.3f}/hour" in items["gpu"]["description"]
    # Vast's billing page wording: the disk's hours at the whole disk's $/hour.
    said = re.match(r"([\d.]+) hours at \$([\d.]+)/hour", items["disk"]["description"])
    disk_h, disk_rate = said.groups()
    assert float(disk_h) == pytest.approx((destroyed - created) / 3600, abs=1e-6)
    assert float(disk_rate) == pytest.approx(offer["storage_cost"] * disk / 720, abs=1e-6)


DAY = 86_400


def test_charges_come_in_day_rows_keyed_at_midnight_utc(sandbox: Sandbox):
    """As Vast's show_charges spec shows them: a row per contract and UTC day, start and end at
    midnights, ``lte`` inclusive, a range summing its days (sandbox/README, "Charges")."""
    client = sandbox.client()
    iid = sandbox.create(PRICEY_ASK)
    sandbox.wait_status(iid, "running")
    sandbox.inject(iid, "age", 2 * DAY)  # running since this time two days ago
    started = {e["kind"]: e["ts"] for e in sandbox.debug(iid)["events"]}["running"]
    first_day = int(started) // DAY * DAY
    hourly = market_offers()[PRICEY_ASK]["dph_base"]

    def charges(lo: float, hi: float) -> list[dict]:
        return client.get(
            "/api/v0/charges/",
            params={"select_filters": json.dumps({"day": {"gte": lo, "lte": hi}})},
        ).json()["results"]

    (day_one,) = charges(first_day, first_day + DAY - 1)  # Vast's own way to ask for a day
    assert (day_one["start"], day_one["end"]) == (first_day, first_day)
    assert day_one["description"] == f"Instance {iid} Charges - 1 day"
    gpu = next(i for i in day_one["items"] if i["type"] == "gpu")
    assert (gpu["start"], gpu["end"]) == (first_day, first_day)
    assert gpu["amount"] == pytest.approx(hourly * (first_day + DAY - started) / 3600, abs=6e-4)
    # The next midnight is a day key too: lte there brings the next day's row with it.
    (two,) = charges(first_day, first_day + DAY)
    assert (two["start"], two["end"]) == (first_day, first_day + DAY)
    assert two["description"] == f"Instance {iid} Charges - 2 days"
    # A whole range is the sum of its days; a window starting after a midnight skips that row.
    now = time.time()
    (whole,) = charges(first_day, now)
    days = [charges(k, k + DAY - 1)[0]["amount"] for k in range(first_day, int(now), DAY)]
    assert len(days) == 3
    assert whole["amount"] == pytest.approx(sum(days), abs=0.0015)
    assert whole["end"] == first_day + 2 * DAY
    assert charges(first_day + 1, first_day + DAY - 1) == []
    missing = client.get("/api/v0/charges/")
    assert (missing.status_code, missing.json()["error"]) == (400, "invalid_args")
    assert "'day' gte and lte" in missing.json()["msg"]


def test_traffic_through_the_instance_proxy_is_metered_once(sandbox: Sandbox):
    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "300000")
            self.end_headers()
            self.wfile.write(b"u" * 300000)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    script = (
        "python3 - <<'EOF'\n"
        "import os, urllib.request\n"
        "base, me = os.environ['SANDBOX_URL'], os.environ['SANDBOX_INSTANCE_ID']\n"
        "urllib.request.urlopen(f'{base}/sandbox/download/{me}?bytes=1000000').read()\n"
        f"urllib.request.urlopen('http://127.0.0.1:{upstream.server_port}/model').read()\n"
        f"up = 'http://127.0.0.1:{upstream.server_port}'\n"
        "urllib.request.urlopen(f'{up}/ckpt', data=b'c' * 200000).read()\n"
        "open('net_dev_env', 'w').write(os.environ['NOMAD_NET_DEV'])\n"
        "open('done', 'w').close()\n"
        "EOF\n"
    )
    try:
        iid = sandbox.create(cheapest_ask(sandbox), onstart=script + SLEEP_ONSTART)
        done = Path(sandbox.debug(iid)["scratch"]) / "done"
        wait_until(done.exists, timeout=15, what="the instance's transfers")
    finally:
        upstream.shutdown()

    info = sandbox.debug(iid)
    received = info["usage"]["down_bytes"] - info["image_bytes"]
    assert 1_300_000 <= received <= 1_300_000 + 3 * 1024  # bodies plus headers, counted once
    assert 200_000 <= info["usage"]["up_bytes"] <= 200_000 + 3 * 1024
    # The instance's own NIC counters (its agent's NOMAD_NET_DEV): the same bytes, no pull.
    counters = Path(info["scratch"]) / "net_dev"
    assert (Path(info["scratch"]) / "net_dev_env").read_text() == str(counters)
    assert parse_net_dev(counters.read_text())["eth0"] == (received, info["usage"]["up_bytes"])


def test_invoices_list_the_top_up_as_a_negative_credit(sandbox: Sandbox):
    client = sandbox.client()
    when = {"select_filters": json.dumps({"when": {"gte": 0, "lte": 2e9}})}
    sandbox.anon().post("/sandbox/topup", json={"api_key": DEFAULT_KEY, "amount": 25})

    rows = client.get("/api/v1/invoices/", params=when).json()["results"]
    bad = client.get(
        "/api/v1/invoices/", params={"select_filters": json.dumps({"when": {"gte": 5, "lte": 1}})}
    )

    assert [(r["type"], r["amount"], r["metadata"]["service"]) for r in rows] == [
        ("credit", -25.0, "stripe_payments"),
        ("credit", -100.0, "stripe_payments"),
    ]
    assert (bad.status_code, bad.json()) == (
        200,
        {"success": False, "error": "Invalid date range", "count": 0, "results": []},
    )
    user = client.get("/api/v0/users/current").json()
    assert user["credit"] == pytest.approx(125.0)
    assert user["email"]
    assert user["id"]


def test_running_out_of_credit_stops_instances(sandbox_factory):
    box = sandbox_factory("--credit", "0.002")
    h200 = box.search({"gpu_name": {"eq": "H200"}})[0]["id"]  # $32/h: the credit lasts ~0.2 s

    iid = box.create(h200, onstart=SLEEP_ONSTART)

    wait_until(lambda: box.status(iid) == "stopped", timeout=15, what="the instance to be stopped")
    shown = box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert "credit" in shown["status_msg"]
    assert box.debug(iid)["billing_now"] == ["disk"]
    assert box.client().get("/api/v0/users/current").json()["credit"] <= 0
    restart = box.client().put(f"/api/v0/instances/{iid}/", json={"state": "running"})
    assert (restart.status_code, restart.json()["error"]) == (400, "missing_billing")
