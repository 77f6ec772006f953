"""The sandbox's market weather (``sandbox/weather.py``): rentals that fail on their own, the
way Vast rentals do, seeded.

The model is plain functions, so its calibration is measured on thousands of simulated rentals
without a server; the sandbox then plays fates out over real HTTP: a host that vanishes, one
that never gets to running, one lost while running or mid-download, and what each bills.
Seeds for the HTTP tests are found with the same functions, so each test's premise is checked
before the sandbox is asked to play it out.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import first_attempts, weather
from sandbox.market import DEFAULT_MARKET, Market, load_offers
from sandbox.timing import CONTAINER_START_S, IMAGE_BYTES, Timing
from tests.support.processes import wait_until

OFFERS = load_offers(DEFAULT_MARKET)
BY_ASK = {o["id"]: o for o in OFFERS}
IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"  # 3.6 GB in the sandbox's table
FIRST_ID = 21_000_001  # the sandbox's first instance id
TARGETS = {"good": 0.95, "typical": 0.75, "bad": 0.40}
RENTALS = 2000
QUICK = {"timeout": 20.0, "every": 0.02}  # a served sandbox answers in well under that


# ---- the model, as plain functions ---------------------------------------------------------


def test_the_same_seed_gives_the_same_traits_and_the_same_fates():
    def draw(seed: int) -> tuple[list, list]:
        traits = [weather.machine_traits(o, "typical", seed) for o in OFFERS]
        fates = [weather.rental_fate(t, seed, FIRST_ID + i) for i, t in enumerate(traits)]
        return traits, fates

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    outcomes = first_attempts.simulate_rentals(OFFERS, "bad", 7, 300)
    assert outcomes == first_attempts.simulate_rentals(OFFERS, "bad", 7, 300)


def test_the_start_weather_draws_the_fates_provider_start_and_nothing_else():
    # --start-weather: the same created → loading as the rental's fate, with no fate at all.
    for name in ("good", "typical", "bad"):
        for i, offer in enumerate(OFFERS[:50]):
            fate = weather.rental_fate(weather.machine_traits(offer, name, 7), 7, FIRST_ID + i)
            assert weather.provider_start_s(name, 7, FIRST_ID + i) == fate.scheduling_s
    typical = [weather.provider_start_s("typical", 7, FIRST_ID + i) for i in range(400)]
    busy = [s for s in typical if s >= weather.BUSY_SCHEDULING_S[0]]
    assert min(typical) >= weather.CACHED_SCHEDULING_S[0]
    assert 0.1 < len(busy) / len(typical) < 0.3  # the weather's busy share, 0.2


def test_a_machine_keeps_its_frailty_across_weathers_and_worse_weather_fails_more():
    offer = BY_ASK[15586800]
    frailty = {w: weather.machine_traits(offer, w, 3).frailty for w in TARGETS}
    assert len({round(f, 12) for f in frailty.values()}) == 1
    hazards = [weather.machine_traits(offer, w, 3).load_hazard_per_h for w in TARGETS]
    assert hazards == sorted(hazards)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_weather_succeeds_first_time_about_as_often_as_its_target(name):
    target = TARGETS[name]
    outcomes = first_attempts.simulate_rentals(OFFERS, name, 11, RENTALS)

    measured = sum(o.succeeded for o in outcomes) / RENTALS
    tolerance = 4 * math.sqrt(target * (1 - target) / RENTALS)  # four binomial sigmas
    assert abs(measured - target) <= tolerance, (measured, target, tolerance)


def test_bad_weather_fails_like_noemas_run():
    # noema: 10 rentals, 4 succeeded, 1 never ready, 5 lost mid-download; failures 5.1-14.5
    # min after create, 10.2 min on average, "most failures fail late".
    outcomes = first_attempts.simulate_rentals(OFFERS, "bad", 11, RENTALS)
    where = Counter(o.failed_in for o in outcomes)
    failed_after_min = [o.failed_after_s / 60 for o in outcomes if o.failed_after_s is not None]

    assert 0.06 <= where["never ready"] / RENTALS <= 0.14
    assert where["download"] > where["loading"] + where["running"]
    assert 5.1 <= statistics.mean(failed_after_min) <= 14.5


def test_no_weather_never_fails_on_its_own():
    outcomes = first_attempts.simulate_rentals(OFFERS, "none", 11, RENTALS)
    traits = [weather.machine_traits(o, "none", 11) for o in OFFERS]

    assert all(o.succeeded for o in outcomes)
    assert {(t.never_ready_p, t.load_hazard_per_h, t.run_hazard_per_h) for t in traits} == {
        (0.0, 0.0, 0.0)
    }
    assert {t.link_factor for t in traits} == {1.0}


def test_a_cached_start_takes_the_public_30_to_75_seconds_and_bad_weather_adds_vasts_minutes():
    cached = first_attempts.Start(image_bytes=IMAGE_BYTES["pytorch/pytorch"], image_cached=True)

    def to_running(name: str) -> list[float]:
        traits = [weather.machine_traits(o, name, 5) for o in OFFERS]
        fates = [weather.rental_fate(t, 5, FIRST_ID + i) for i, t in enumerate(traits)]
        return [
            first_attempts.start_outcome(t, f, cached).running_after_s
            for t, f in zip(traits, fates, strict=True)
        ]

    good = [s for s in to_running("good") if s is not None]
    bad = [s for s in to_running("bad") if s is not None]
    assert min(good) >= 30
    assert max(good) <= 75
    assert max(bad) > 120
    assert max(bad) <= 300 + CONTAINER_START_S
    assert statistics.median(bad) > statistics.median(good)


# ---- played out by the sandbox over HTTP ---------------------------------------------------


def find_seed(ask_id: int, wanted: Callable[[weather.Traits, weather.Fate], bool]) -> int:
    """The first seed under which the sandbox's first rental, of ASK_ID in bad weather, meets a
    fate WANTED accepts (and ASK_ID is not pre-rented by the seeded other tenants)."""
    for seed in range(1, 5000):
        if ask_id in Market(OFFERS, seed).taken_by_others:
            continue
        traits = weather.machine_traits(BY_ASK[ask_id], "bad", seed)
        if wanted(traits, weather.rental_fate(traits, seed, FIRST_ID)):
            return seed
    raise AssertionError("no seed gives that fate")


def clean_second_rental(seed: int, besides: int) -> int:
    """An ask (not BESIDES) whose rental, the sandbox's second, gets to running unharmed."""
    taken = Market(OFFERS, seed).taken_by_others
    for offer in OFFERS:
        if offer["id"] in taken or offer["id"] == besides:
            continue
        traits = weather.machine_traits(offer, "bad", seed)
        fate = weather.rental_fate(traits, seed, FIRST_ID + 1)
        if not fate.never_ready and fate.load_loss_after_h * 3600 > pull_s(traits) + 600:
            return offer["id"]
    raise AssertionError("no ask gives a clean second rental")


def pull_s(traits: weather.Traits) -> float:
    return IMAGE_BYTES["pytorch/pytorch"] / weather.down_bytes_per_s(traits)


def bad_weather(sandbox_factory, seed: int, *flags: str):
    return sandbox_factory("--market-weather", "bad", "--seed", str(seed), *flags)


def shown(box, iid: int) -> dict | None:
    return box.client().get(f"/api/v0/instances/{iid}/").json()["instances"]


def listed_ids(box) -> set[int]:
    reply = box.client().get("/api/v1/instances/").json()
    return {i["id"] for i in reply["instances"]}


# A metered host (so the bytes a cut pull got show on the bill), with a cheap disk.
PAID_LINK_ASK = next(
    o["id"] for o in OFFERS if o.get("inet_down_cost", 0) > 0 and o["hosting_type"] == 0
)


def test_a_host_that_vanishes_while_loading_is_gone_and_bills_what_it_used(sandbox_factory):
    def vanishes_late_in_the_pull(traits, fate):
        lost_s = fate.load_loss_after_h * 3600
        return not fate.never_ready and fate.load_loss == "vanish" and lost_s < pull_s(traits)

    seed = find_seed(PAID_LINK_ASK, vanishes_late_in_the_pull)
    box = bad_weather(sandbox_factory, seed)
    iid = box.create(PAID_LINK_ASK, image=IMAGE, disk=20)
    assert iid == FIRST_ID

    wait_until(lambda: shown(box, iid) is None, what="the vanished instance to be gone", **QUICK)

    assert iid not in listed_ids(box)
    assert box.client().delete(f"/api/v0/instances/{iid}/").status_code == 404
    view = box.debug(iid)
    kinds = [e["kind"] for e in view["events"]]
    assert kinds[:2] == ["created", "loading"]
    assert kinds[-1].startswith("host vanished (lost while loading")
    at = {e["kind"].split(" (")[0]: e["ts"] for e in view["events"]}
    assert view["usage"]["gpu_s"] == 0  # no GPU while loading
    existed = at["host vanished"] - at["created"]
    assert view["usage"]["disk_s"] == pytest.approx(existed, abs=0.05)  # storage from creation
    assert 0 < view["usage"]["down_bytes"] < IMAGE_BYTES["pytorch/pytorch"]  # part of a pull
    assert view["billed"]["disk"] > 0
    assert view["billed"]["bwd"] > 0
    assert view["billed"]["gpu"] == 0
    assert view["billing_now"] == []
    assert PAID_LINK_ASK not in {o["id"] for o in box.search({"limit": 1000})}


def test_a_served_start_weather_draws_created_to_loading_and_draws_no_fate(sandbox_factory):
    box = sandbox_factory(
        "--start-weather", "bad", "--seed", "5", "--time-scale", "0.01", fast=False
    )  # fmt: skip
    ask = box.search({"rentable": {"eq": True}})[0]["id"]
    iid = box.create(ask, image=IMAGE, disk=20)

    wait_until(
        lambda: (shown(box, iid) or {}).get("actual_status") == "loading", what="loading", **QUICK
    )

    view = box.debug(iid)
    at = {e["kind"]: e["ts"] for e in view["events"]}
    drawn = weather.provider_start_s("bad", 5, iid) * 0.01  # the weather's draw, scaled
    triangle = Timing(scale=0.01, seed=5).scheduling_s(iid)  # what it would be without the flag
    assert abs(drawn - triangle) > 0.1
    assert at["loading"] - at["created"] == pytest.approx(drawn, abs=0.05)
    assert not view.get("fate")  # none of the weather's failures: weather none otherwise


@pytest.mark.parametrize("where", ["created", "loading"])
def test_a_rental_that_never_gets_to_running_stays_where_vast_leaves_it(sandbox_factory, where):
    seed = find_seed(PAID_LINK_ASK, lambda traits, fate: fate.never_ready == where)
    box = bad_weather(sandbox_factory, seed)
    iid = box.create(PAID_LINK_ASK, image=IMAGE, disk=20)

    if where == "loading":
        stalled = wait_until(
            lambda: "Retrying in 5 seconds" in (shown(box, iid)["status_msg"] or ""),
            what="the stalled pull to say so",
            **QUICK,
        )
        assert stalled
    else:
        # Another rental, made after it, goes through created and loading to running: this one
        # has had every chance to move on and did not.
        other = box.create(clean_second_rental(seed, PAID_LINK_ASK), image=IMAGE, disk=20)
        box.wait_status(other, "running")
        assert shown(box, iid)["status_msg"] is None  # Vast says nothing while provisioning
    assert shown(box, iid)["actual_status"] == where
    view = box.debug(iid)
    assert view["status"] == where
    assert view["usage"]["gpu_s"] == 0
    assert view["billing_now"] == ["disk"]
    assert box.client().delete(f"/api/v0/instances/{iid}/").status_code == 200
    assert box.debug(iid)["billing_now"] == []


def test_a_host_lost_while_running_goes_offline_or_vanishes(sandbox_factory):
    def lost_soon_after_running(traits, fate):
        survives_pull = fate.load_loss_after_h * 3600 > pull_s(traits) + 3600
        return not fate.never_ready and survives_pull and fate.run_loss_after_h < 5

    seed = find_seed(PAID_LINK_ASK, lost_soon_after_running)
    fate = weather.rental_fate(
        weather.machine_traits(BY_ASK[PAID_LINK_ASK], "bad", seed), seed, FIRST_ID
    )
    box = bad_weather(sandbox_factory, seed, "--time-scale", "0.0001")  # a sandbox hour: 0.36 s
    iid = box.create(PAID_LINK_ASK, image=IMAGE, disk=20, onstart="exec sleep 120\n")

    if fate.run_loss == "vanish":
        wait_until(lambda: shown(box, iid) is None, what="the host to vanish", **QUICK)
        assert iid not in listed_ids(box)
    else:
        wait_until(
            lambda: (shown(box, iid) or {}).get("actual_status") == "offline",
            what="offline",
            **QUICK,
        )
        assert shown(box, iid)["status_msg"] == "host unreachable"
    view = box.debug(iid)
    kinds = [e["kind"] for e in view["events"]]
    assert kinds.index("running") < len(kinds) - 1
    assert "lost while running" in kinds[-1]
    assert view["processes"] == []
    assert view["billing_now"] == []
    assert view["usage"]["gpu_s"] > 0


def test_a_host_lost_mid_download_vanishes_once_its_bytes_pass_the_draw(sandbox_factory):
    def lost_in_a_download(traits, fate):
        after_pull = fate.load_loss_after_h * 3600 - pull_s(traits)
        return (
            not fate.never_ready
            and fate.load_loss == "vanish"
            and 30 < after_pull < 300
            and fate.run_loss_after_h > 50
        )

    seed = find_seed(PAID_LINK_ASK, lost_in_a_download)
    traits = weather.machine_traits(BY_ASK[PAID_LINK_ASK], "bad", seed)
    fate = weather.rental_fate(traits, seed, FIRST_ID)
    byte_scale = 1e-4  # the link carries a ten-thousandth of the bytes (--byte-scale)
    box = bad_weather(sandbox_factory, seed, "--byte-scale", str(byte_scale))
    iid = box.create(PAID_LINK_ASK, image=IMAGE, disk=20, onstart="exec sleep 120\n")
    box.wait_status(iid, "running")
    assert shown(box, iid) is not None

    survives_s = fate.load_loss_after_h * 3600 - pull_s(traits)
    half = int(survives_s / 2 * weather.down_bytes_per_s(traits) * byte_scale)
    box.anon().get(f"/sandbox/download/{iid}", params={"bytes": half})
    assert shown(box, iid)["actual_status"] == "running"  # half the draw: still there
    box.anon().get(f"/sandbox/download/{iid}", params={"bytes": 2 * half})

    wait_until(lambda: shown(box, iid) is None, what="the host to vanish mid-download", **QUICK)
    assert "lost mid-download" in box.debug(iid)["events"][-1]["kind"]


def test_pull_progress_is_what_status_msg_says_while_loading(sandbox_factory):
    # No weather: a 3.6 GB pull at a tenth of real time, watched through Vast's own fields.
    box = sandbox_factory("--time-scale", "0.1", "--scheduling-s", "0", fast=False)
    ask = box.search({"inet_down": {"gte": 800, "lte": 1500}, "rentable": {"eq": True}})[0]["id"]
    iid = box.create(ask, image=IMAGE, disk=20)
    seen: list[str] = []

    def running() -> bool:
        inst = shown(box, iid)
        if inst["actual_status"] == "loading" and inst["status_msg"]:
            seen.append(inst["status_msg"])
        return inst["actual_status"] == "running"

    wait_until(running, what="the pull to finish", timeout=60, every=0.02)

    downloading = [m for m in seen if ": Downloading " in m]
    assert len(set(downloading)) >= 2  # it moves
    done = [float(m.split(": Downloading ")[1].split("GB/")[0]) for m in downloading if "GB/" in m]
    assert done == sorted(done)
    assert downloading[0].endswith("/3.6GB")
    assert shown(box, iid)["status_msg"] is None  # running: nothing to say


def test_manual_injections_still_work_under_a_weather(sandbox_factory):
    box = sandbox_factory("--market-weather", "good", "--seed", "4")
    ask = box.search({"rentable": {"eq": True}, "reliability": {"gte": 0.99}, "limit": 1})[0]
    iid = box.create(ask["id"], onstart="exec sleep 120\n")
    box.wait_status(iid, "running")

    box.inject(iid, "destroy")

    assert shown(box, iid)["actual_status"] == "offline"
    assert box.debug(iid)["weather"]["weather"] == "good"


def test_the_traits_are_shown_to_an_operator_and_never_through_the_vast_api(sandbox_factory):
    box = sandbox_factory("--market-weather", "typical", "--seed", "9")
    hidden = {"frailty", "never_ready_p", "load_hazard_per_h", "link_factor", "step_factor"}

    listing = subprocess.run(
        [sys.executable, "-m", "sandbox", "machines", "--url", box.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    machines = json.loads(listing.stdout)
    assert machines["weather"] == "typical"
    assert len(machines["machines"]) == len(OFFERS)
    first = machines["machines"][0]
    expected = weather.machine_traits(BY_ASK[first["ask_id"]], "typical", 9)
    assert first["frailty"] == pytest.approx(expected.frailty)
    assert hidden <= set(first)

    offer = box.search({"rentable": {"eq": True}, "limit": 1})[0]
    iid = box.create(offer["id"])
    served = json.dumps([offer, shown(box, iid), box.client().get("/api/v1/instances/").json()])
    assert not any(f'"{name}"' in served for name in hidden)
    assert box.anon().get("/sandbox/health").json()["market_weather"] == "typical"


def test_tests_and_fast_get_no_weather_unless_they_ask(sandbox_factory, monkeypatch):
    monkeypatch.setenv(weather.ENV_VAR, "bad")  # a variable left in a shell
    box = sandbox_factory()

    assert box.anon().get("/sandbox/health").json()["market_weather"] == "none"
    offer = box.search({"rentable": {"eq": True}, "limit": 1})[0]
    assert box.debug(box.create(offer["id"]))["weather"] is None
