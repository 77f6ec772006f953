"""The sandbox's buyer hazards over HTTP (``sandbox/engine/buyer_hazards.py``): an ask sold to a
second buyer (skypilot#9117) and a create answered 504 after it made its instance
(skypilot#10171), each armed for one create of one ask, by the API and by the CLI."""

from __future__ import annotations

import subprocess
import sys

from tests.support.sandbox import ROOT


def some_ask(box) -> int:
    offers = box.client().post("/api/v0/bundles/", json={"limit": 5}).json()["offers"]
    return offers[0]["id"]


def test_an_ask_armed_to_double_sell_takes_one_second_buyer(sandbox):
    ask = some_ask(sandbox)
    sandbox.create(ask, label="first")
    taken = sandbox.client().put(f"/api/v0/asks/{ask}/", json={"image": "ubuntu:22.04"})
    assert taken.status_code == 404  # as Vast answers a taken ask

    sandbox.arm("double-sell", ask)
    second = sandbox.create(ask, label="second")
    third = sandbox.client().put(f"/api/v0/asks/{ask}/", json={"image": "ubuntu:22.04"})

    assert sandbox.debug(second)["ask_id"] == ask
    assert third.status_code == 404  # one arming, one second buyer


def test_a_create_armed_to_time_out_makes_its_instance_and_answers_504(sandbox):
    ask = some_ask(sandbox)
    sandbox.arm("create-timeout", ask)

    lost = sandbox.client().put(
        f"/api/v0/asks/{ask}/", json={"image": "ubuntu:22.04", "label": "ngpu:test:1:1.1"}
    )

    assert lost.status_code == 504
    assert "new_contract" not in lost.json()
    [made] = sandbox.client().get("/api/v1/instances/").json()["instances"]
    assert made["label"] == "ngpu:test:1:1.1"  # only its label finds it
    kinds = [e["kind"] for e in sandbox.debug(made["id"])["events"]]
    assert "answer lost" in kinds


def test_the_cli_arms_them_and_an_unknown_ask_is_refused(sandbox):
    ask = some_ask(sandbox)

    def inject(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "sandbox", "inject", *argv, "--url", sandbox.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )

    armed = inject("create-timeout", str(ask))
    unknown = inject("double-sell", "1")

    assert armed.returncode == 0, armed.stderr
    assert '"armed": 1' in armed.stdout
    assert unknown.returncode == 1
    assert "no ask 1" in unknown.stdout
