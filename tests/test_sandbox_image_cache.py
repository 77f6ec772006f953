"""The sandbox keeps a machine's pulled image for its next rental, as Vast hosts keep Docker
layers (``sandbox/image_cache.py``), and a seeded share of hosts wipe it in between.

Over real HTTP: the same ask rented twice, one instance after the other. Phase lengths are read
from the sandbox's own event log (its clock), never from sleeps in the test.
"""

from __future__ import annotations

from sandbox.image_cache import wiped_between_rentals
from tests.support.sandbox import Sandbox

IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"  # 3.6 GB in the sandbox's table
IMAGE_BYTES = 3_600_000_000
# Scale 0.03: a 3.6 GB pull at ~1 Gbit/s (34 s) takes the --fast cap of 1 s, a container start
# (5 s) 0.15 s: far enough apart to tell from the event log.
FLAGS = ("--time-scale", "0.03")


def cheapest_fast_ask(box: Sandbox) -> int:
    query = {
        "inet_down": {"gte": 800, "lte": 1200},
        "rentable": {"eq": True},
        "order": [["dph_total", "asc"]],
    }
    return box.search({**query, "limit": 1})[0]["id"]


def rent_until_running(box: Sandbox, ask_id: int) -> dict:
    """Rent ASK_ID with IMAGE, wait for it to run, destroy it; its sandbox-side view."""
    iid = box.create(ask_id, image=IMAGE, disk=20)
    box.wait_status(iid, "running")
    view = box.debug(iid)
    assert box.client().delete(f"/api/v0/instances/{iid}/").status_code == 200
    return view


def loading_seconds(view: dict) -> float:
    at = {e["kind"]: e["ts"] for e in view["events"]}
    return at["running"] - at["loading"]


def test_a_second_instance_on_the_same_machine_finds_the_image_and_only_starts(sandbox_factory):
    box = sandbox_factory(*FLAGS)
    ask = cheapest_fast_ask(box)

    first = rent_until_running(box, ask)
    second = rent_until_running(box, ask)

    assert first["image_source"] == "pulled"
    assert second["image_source"] == "machine"
    assert "image cached on the machine" in [e["kind"] for e in second["events"]]
    assert loading_seconds(first) >= 0.9  # the pull
    assert loading_seconds(second) < 0.5  # the container start only
    # No image bytes cross the metered link the second time.
    assert first["usage"]["down_bytes"] == IMAGE_BYTES
    assert second["usage"]["down_bytes"] == 0


def test_a_host_that_wiped_the_image_pulls_it_again(sandbox_factory):
    box = sandbox_factory(*FLAGS, "--image-wipe-chance", "1", "--seed", "5")
    ask = cheapest_fast_ask(box)

    rent_until_running(box, ask)
    again = rent_until_running(box, ask)

    assert again["image_source"] == "wiped"
    assert "image wiped from the machine" in [e["kind"] for e in again["events"]]
    assert loading_seconds(again) >= 0.7  # a whole pull (jittered x0.8-1.25 by the seed)
    assert again["usage"]["down_bytes"] == IMAGE_BYTES


def test_the_wipe_is_one_seeded_draw_per_instance_at_the_chance_given():
    ids = range(21_000_001, 21_002_001)
    draws = [wiped_between_rentals(7, i, 0.2) for i in ids]

    assert draws == [wiped_between_rentals(7, i, 0.2) for i in ids]  # the same seed, the same
    assert draws != [wiped_between_rentals(8, i, 0.2) for i in ids]
    assert 0.17 < sum(draws) / len(draws) < 0.23
    assert not any(wiped_between_rentals(7, i, 0.0) for i in ids)
