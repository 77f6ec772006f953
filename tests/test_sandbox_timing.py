"""The sandbox's provider start (created → loading) as Vast's minutes, drawn and seeded; an
image sized by flag; links that carry scaled-down bytes for a bench (``--byte-scale``)."""

from __future__ import annotations

import statistics
import time

from sandbox.timing import SCHEDULING_TRIANGLE_S, Timing

LOW, MODE, HIGH = SCHEDULING_TRIANGLE_S


def test_a_fresh_instance_schedules_for_vasts_minutes_not_seconds():
    draws = [Timing(seed=4).scheduling_s(i) for i in range(1, 401)]

    assert min(draws) >= LOW
    assert max(draws) <= HIGH
    assert 120 <= statistics.median(draws) <= 190  # "2-5 minutes", the field report's 1.5-3.5
    assert len({round(d, 6) for d in draws}) > 300  # one draw per instance, not one for all


def test_the_draw_repeats_with_the_seed_and_follows_the_time_scale():
    first = [Timing(seed=4).scheduling_s(i) for i in range(1, 21)]
    again = [Timing(seed=4).scheduling_s(i) for i in range(1, 21)]
    other = [Timing(seed=5).scheduling_s(i) for i in range(1, 21)]
    scaled = [Timing(scale=0.02, seed=4).scheduling_s(i) for i in range(1, 21)]

    assert first == again != other
    assert scaled == [s * 0.02 for s in first]
    assert Timing.fast(4).scheduling_s(3) == 0.1  # --fast: the flat 3 s, at its floor
    assert Timing(scheduling_fixed_s=3.0).scheduling_s(7) == 3.0


def test_an_image_sized_by_flag_is_pulled_and_billed_at_that_size(sandbox_factory):
    box = sandbox_factory("--image-size", "ghcr.io/team/qlora:2026-11=4000000000")

    offer = box.search({"rentable": {"eq": True}, "limit": 1})[0]
    iid = box.create(offer["id"], image="ghcr.io/team/qlora:2026-11")

    assert box.debug(iid)["image_bytes"] == 4_000_000_000


def test_byte_scale_slows_a_link_for_a_caller_sending_fewer_bytes(sandbox_factory):
    # --fast: a link carries 100x its speed; --byte-scale 0.0001 then leaves a 100th of it (the
    # fastest link: a download of many chunks, each paced after it is sent).
    box = sandbox_factory("--byte-scale", "0.0001")
    offer = box.search({"rentable": {"eq": True}, "order": [["inet_down", "desc"]], "limit": 1})[0]
    iid = box.create(offer["id"], onstart="exec sleep 120\n")
    box.wait_status(iid, "running")
    rate = offer["inet_down"] * 1e6 / 8 / 0.01 * 0.0001  # bytes per wall second
    nbytes = int(rate * 1.0)

    started = time.monotonic()
    body = box.anon().get(f"/sandbox/download/{iid}", params={"bytes": nbytes}).content
    took = time.monotonic() - started

    assert len(body) == nbytes
    assert took >= 0.8  # paced, never faster than the link: the same bytes take 1 s
