"""The sandbox's interruptible market over real HTTP: outbids, a moving min_bid, change bid.

What is modelled and where Vast says so is in ``sandbox/bids.py`` and the sandbox
README. Time runs fast here: ``--time-scale 0.0001`` makes a sandbox hour 0.36 s of wall time,
so hours of market happen in a second or two. Waiting is polling with a deadline.
"""

from __future__ import annotations

import math

import httpx
import pytest

from hosts.vast import VastClient
from hosts.vast.errors import InstanceGone, ProviderError
from hosts.vast.transport import RetryPolicy
from sandbox.bids import BidMarket, BidSettings, min_bid_bounds, outbid_rate_per_h
from tests.support.bids import SLEEP_ONSTART, bid_asks, rent_bid, shown
from tests.support.processes import wait_until
from tests.support.sandbox import DEFAULT_KEY, Sandbox, market_offers

HOUR_0_36_S = ("--time-scale", "0.0001")  # with --fast: one sandbox hour = 0.36 s


def change_bid(box: Sandbox, iid: int, price, key: str | None = DEFAULT_KEY) -> httpx.Response:
    body = {"client_id": "me", "price": price}
    return box.client(key).put(f"/api/v0/instances/bid_price/{iid}/", json=body)


def outbids(box: Sandbox, iid: int) -> list[dict]:
    return box.debug(iid)["bid"]["outbids"]


def states(row: dict) -> tuple:
    return row["actual_status"], (row["cur_state"], row["intended_status"], row["next_state"])


# ---- the model itself --------------------------------------------------------------------------


def test_the_outbid_rate_falls_exponentially_with_the_margin():
    assert outbid_rate_per_h(0.0, 0.3, 0.25) == pytest.approx(0.3)
    assert outbid_rate_per_h(0.25, 0.3, 0.25) == pytest.approx(0.3 / math.e)
    assert outbid_rate_per_h(0.5, 0.3, 0.25) == pytest.approx(0.3 / math.e**2)
    assert outbid_rate_per_h(0.1, 0.0, 0.25) == 0.0  # 0 turns it off


def test_the_min_bid_walk_is_seeded_bounded_and_off_at_zero():
    offers = market_offers()
    on = BidSettings(min_bid_step_pct=20.0)
    one, two = (BidMarket(offers, on, 3, hour_s=1.0, epoch=0.0) for _ in range(2))
    other = BidMarket(offers, on, 4, hour_s=1.0, epoch=0.0)
    ask = next(iter(offers))
    walk = [one.floor(ask, t + 0.5) for t in range(200)]
    assert walk == [two.floor(ask, t + 0.5) for t in range(200)]
    assert walk != [other.floor(ask, t + 0.5) for t in range(200)]
    assert walk[0] == offers[ask]["min_bid"]
    assert len(set(walk)) > 50
    floor, ceiling = min_bid_bounds(offers[ask]["dph_base"], walk[0])
    assert floor >= 0.3 * offers[ask]["dph_base"] or floor == walk[0]
    assert all(floor <= v <= ceiling for v in walk)
    fixed = BidMarket(offers, BidSettings.off(), 3, hour_s=1.0, epoch=0.0)
    assert {fixed.floor(ask, t) for t in range(50)} == {offers[ask]["min_bid"]}


def test_fast_sandboxes_keep_the_market_still_unless_asked(sandbox_factory):
    fast = sandbox_factory().anon().get("/sandbox/health").json()["bids"]
    assert (fast["outbid_rate_per_h"], fast["min_bid_step_pct"]) == (0.0, 0.0)
    real = sandbox_factory(fast=False).anon().get("/sandbox/health").json()
    assert (real["bids"]["outbid_rate_per_h"], real["bids"]["min_bid_step_pct"]) == (0.3, 5.0)
    assert (real["bids"]["outbid_margin_scale"], real["sandbox_hour_s"]) == (0.25, 3600.0)
    asked = sandbox_factory("--outbid-rate-per-h", "1.5", "--min-bid-step-pct", "2")
    flags = asked.anon().get("/sandbox/health").json()["bids"]
    assert (flags["outbid_rate_per_h"], flags["min_bid_step_pct"]) == (1.5, 2.0)


# ---- other tenants outbid at a rate set by the margin -------------------------------------------

MARKET_FLAGS = (
    *HOUR_0_36_S,
    "--outbid-rate-per-h",
    "3",
    "--outbid-margin-scale",
    "0.25",
    "--outbid-hold-h",
    "0.25",
    "--min-bid-step-pct",
    "0",
)


def first_outbid_hours(box: Sandbox, iid: int, count: int) -> list[float]:
    """The running hours at which INST's first COUNT outbids by other tenants happened."""
    found = wait_until(
        lambda: [o for o in outbids(box, iid) if o["cause"] == "a higher bid"][count - 1 :],
        timeout=20,
        what=f"{count} outbids of instance {iid}",
        every=0.05,
    )
    assert found
    return [o["running_h"] for o in outbids(box, iid) if o["cause"] == "a higher bid"][:count]


def test_a_higher_margin_is_outbid_less_often_and_the_same_seed_repeats_it(sandbox_factory):
    box = sandbox_factory("--seed", "11", *MARKET_FLAGS)
    low_offer, high_offer = bid_asks(box, 2)
    low = rent_bid(box, low_offer, low_offer["min_bid"])  # margin 0: 3 outbids an hour
    high = rent_bid(box, high_offer, high_offer["min_bid"] * 2.5)  # 1.5: 3 e^-6 = 0.007/h
    assert box.debug(high)["bid"]["outbid_rate_per_h"] == pytest.approx(3 * math.exp(-6), rel=0.02)

    hours = first_outbid_hours(box, low, 8)  # some 3 s; the same sandbox hours for both

    assert len(outbids(box, high)) <= 1
    assert box.debug(high)["bid"]["running_h"] > hours[-1] > 0  # it ran all along
    # Outbid, then back when the higher bid's job ends: each time onstart runs again.
    assert box.debug(low)["runs"] >= 8
    # The same seed, bids and instance ids: the same running hours between outbids. Another
    # seed: other draws.
    again = sandbox_factory("--seed", "11", *MARKET_FLAGS)
    same = rent_bid(again, low_offer, low_offer["min_bid"])
    assert same == low
    assert first_outbid_hours(again, same, 3) == pytest.approx(hours[:3], abs=1e-6)
    other = sandbox_factory("--seed", "12", *MARKET_FLAGS)
    other_offer = bid_asks(other, 1)[0]  # seed 12 pre-rents other asks
    assert rent_bid(other, other_offer, other_offer["min_bid"]) == low
    assert first_outbid_hours(other, low, 1)[0] != pytest.approx(hours[0], abs=1e-3)


def test_a_random_outbid_looks_like_the_injected_one_and_shows_the_winning_bid(sandbox_factory):
    box = sandbox_factory(
        "--seed", "2", *HOUR_0_36_S, "--outbid-rate-per-h", "3", "--outbid-hold-h", "inf"
    )
    offer = bid_asks(box, 1)[0]
    iid = rent_bid(box, offer, offer["min_bid"])
    box.wait_status(iid, "running")

    wait_until(lambda: outbids(box, iid), timeout=20, what="an outbid", every=0.05)

    row = shown(box, iid)
    assert states(row) == ("stopped", ("stopped",) * 3)
    assert "higher bid" in row["status_msg"]
    rival = box.debug(iid)["bid"]["rival_bid"]
    assert row["min_bid"] == rival > row["dph_base"] == round(offer["min_bid"], 4)
    assert box.debug(iid)["billing_now"] == ["disk"]
    assert box.search({"id": {"eq": offer["id"]}, "type": "bid"})[0]["min_bid"] == rival


# ---- min_bid moves -----------------------------------------------------------------------------


def test_min_bid_walks_every_sandbox_hour_and_a_bid_it_passes_loses_the_machine(sandbox_factory):
    box = sandbox_factory("--seed", "2", *HOUR_0_36_S, "--min-bid-step-pct", "50")
    offer = bid_asks(box, 1)[0]
    query = {"id": {"eq": offer["id"]}, "type": "bid"}
    seen: list[float] = []

    def moved() -> bool:
        row = box.search(query)[0]
        assert row["dph_total"] == pytest.approx(row["min_bid"] + row["storage_total_cost"])
        seen.append(row["min_bid"])
        return len(set(seen)) >= 4

    wait_until(moved, timeout=10, what="min_bid to move", every=0.05)
    floor, ceiling = min_bid_bounds(market_offers()[offer["id"]]["dph_base"], offer["min_bid"])
    assert all(floor <= v <= ceiling for v in seen)

    # A bid at the walk's floor wins only while min_bid sits there: it runs when the walk
    # falls to it and loses the machine at the next rise.
    iid = rent_bid(box, offer, floor)
    wait_until(
        lambda: any(o["cause"] == "min_bid rose over the bid" for o in outbids(box, iid)),
        timeout=20,
        what="min_bid to rise over a running bid",
        every=0.02,
    )

    record = next(o for o in outbids(box, iid) if o["cause"] == "min_bid rose over the bid")
    assert record["min_bid"] > record["price"] == floor
    assert box.debug(iid)["runs"] >= 1
    stopped = [e for e in box.debug(iid)["events"] if "min_bid rose" in e["detail"]]
    assert stopped
    assert stopped[0]["kind"] == "stopped"


# ---- change bid ------------------------------------------------------------------------------


def test_a_raised_bid_wins_an_injected_outbid_back_and_onstart_runs_again(sandbox: Sandbox):
    offer = bid_asks(sandbox, 1)[0]
    price = round(offer["min_bid"] + 0.01, 4)
    iid = rent_bid(sandbox, offer, price)
    sandbox.wait_status(iid, "running")
    wait_until(lambda: sandbox.debug(iid)["runs"] == 1, timeout=5, what="onstart")

    sandbox.inject(iid, "outbid")

    row = shown(sandbox, iid)
    assert states(row) == ("stopped", ("stopped",) * 3)
    rival = row["min_bid"]
    assert rival > price  # the winner's bid is the machine's min_bid now
    # Still under the winning bid: accepted, but the machine stays the other tenant's.
    between = round((price + rival) / 2, 4)
    assert change_bid(sandbox, iid, between).json() == {"success": True}
    assert shown(sandbox, iid)["actual_status"] == "stopped"
    assert shown(sandbox, iid)["dph_base"] == between

    assert change_bid(sandbox, iid, rival).json() == {"success": True}

    sandbox.wait_status(iid, "running")
    row = shown(sandbox, iid)
    assert (row["intended_status"], row["cur_state"], row["dph_base"]) == ("running",) * 2 + (
        rival,
    )
    assert sandbox.debug(iid)["runs"] == 2
    assert sandbox.debug(iid)["rates"]["gpu_per_hour"] == rival


def test_a_bid_created_under_min_bid_starts_once_raised_and_a_lowered_one_loses(sandbox: Sandbox):
    offer = bid_asks(sandbox, 1)[0]
    reply = sandbox.client().put(
        f"/api/v0/asks/{offer['id']}/",
        json={"image": "ubuntu", "price": round(offer["min_bid"] / 2, 4), "onstart": SLEEP_ONSTART},
    )
    assert reply.json()["success"] is False
    iid = reply.json()["new_contract"]

    # No price: "a winning bid price is used as the default" (the CLI's help) — min_bid.
    assert change_bid(sandbox, iid, None).json() == {"success": True}

    sandbox.wait_status(iid, "running")
    assert shown(sandbox, iid)["dph_base"] == offer["min_bid"]
    assert change_bid(sandbox, iid, round(offer["min_bid"] - 0.01, 4)).json()["success"] is True
    row = shown(sandbox, iid)
    assert states(row) == ("stopped", ("stopped",) * 3)
    assert "bid below min_bid" in row["status_msg"]


def test_a_renter_stopped_outbid_instance_stays_stopped_when_its_bid_wins(sandbox: Sandbox):
    offer = bid_asks(sandbox, 1)[0]
    iid = rent_bid(sandbox, offer, offer["min_bid"])
    sandbox.wait_status(iid, "running")
    sandbox.inject(iid, "outbid")
    put = sandbox.client().put(f"/api/v0/instances/{iid}/", json={"state": "stopped"})
    assert put.json()["success"] is True

    assert change_bid(sandbox, iid, shown(sandbox, iid)["min_bid"]).json()["success"] is True

    assert sandbox.debug(iid)["outbid"] is False
    assert sandbox.status(iid) == "stopped"
    assert (
        sandbox.client()
        .put(f"/api/v0/instances/{iid}/", json={"state": "running"})
        .json()["success"]
    )
    sandbox.wait_status(iid, "running")


def test_change_bid_prices_the_gpu_hours_after_it_only(sandbox: Sandbox):
    offer = bid_asks(sandbox, 1)[0]
    first = round(offer["min_bid"] + 0.01, 4)
    iid = rent_bid(sandbox, offer, first)
    sandbox.wait_status(iid, "running")
    wait_until(lambda: sandbox.debug(iid)["usage"]["gpu_s"] > 0.4, timeout=5, what="GPU time")
    second = round(first * 3, 4)

    change_bid(sandbox, iid, second)
    gpu_s = sandbox.debug(iid)["usage"]["gpu_s"]
    wait_until(
        lambda: sandbox.debug(iid)["usage"]["gpu_s"] > gpu_s + 0.4, timeout=5, what="GPU time"
    )

    view = sandbox.debug(iid)
    average = view["billed"]["gpu"] / (view["usage"]["gpu_s"] / 3600)
    assert first < average < second


def test_change_bid_refuses_what_vast_refuses(sandbox_factory):
    box = sandbox_factory(keys=(DEFAULT_KEY, "other-key"))
    offer, on_demand_offer = bid_asks(box, 2)
    iid = rent_bid(box, offer, offer["min_bid"])
    on_demand = box.create(on_demand_offer["id"])

    for price in (0, 0.0009, -1, 32.01, "cheap", True, [1]):
        reply = change_bid(box, iid, price)
        assert (reply.status_code, reply.json()["error"]) == (400, "invalid_args"), price
    assert change_bid(box, iid, 0).json()["msg"] == "Please set a bid price >= 0.001."
    assert change_bid(box, iid, 32).json() == {"success": True}  # the spec's maximum
    reply = change_bid(box, on_demand, 1.0)
    assert (reply.status_code, reply.json()["error"]) == (400, "invalid_args")
    assert "on-demand" in reply.json()["msg"]
    for missing in (999_999_999, iid):  # unknown, and another account's
        reply = change_bid(box, missing, 1.0, key="other-key" if missing == iid else DEFAULT_KEY)
        assert (reply.status_code, reply.json()["error"]) == (404, "no_such_instance")
    assert change_bid(box, iid, 1.0, key=None).status_code == 401
    reply = box.client().put(f"/api/v0/instances/bid_price/{iid}/", json=[1.0])
    assert (reply.status_code, reply.json()["error"]) == (400, "invalid_args")


def test_change_bid_is_limited_to_one_call_per_5_5_s_and_the_client_waits_it_out(
    sandbox_factory,
):
    box = sandbox_factory(relaxed=False)
    offer = bid_asks(box, 1)[0]
    iid = rent_bid(box, offer, offer["min_bid"])
    price = round(offer["min_bid"] + 0.02, 4)
    assert change_bid(box, iid, offer["min_bid"] + 0.01).status_code == 200

    reply = change_bid(box, iid, price)

    # The spec's 429 for this endpoint; --fast scales 5.5 s to a quarter (1.375 s).
    assert reply.status_code == 429
    assert reply.json() == {"detail": "API requests too frequent endpoint threshold=1.375"}
    with VastClient(DEFAULT_KEY, box.url, retry=RetryPolicy(base_delay=0.05)) as client:
        client.change_bid(iid, price)  # 429 again, then after the 1.375 s it names: served
    assert shown(box, iid)["dph_base"] == price


# ---- the project's client and the official CLI -------------------------------------------------


def test_the_vast_client_changes_a_bid_and_maps_vasts_refusals(sandbox: Sandbox):
    offer, on_demand_offer = bid_asks(sandbox, 2)
    iid = rent_bid(sandbox, offer, offer["min_bid"])
    on_demand = sandbox.create(on_demand_offer["id"])
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        price = round(offer["min_bid"] + 0.01, 4)
        assert client.change_bid(iid, price) is None

        assert shown(sandbox, iid)["dph_base"] == price
        with pytest.raises(InstanceGone):
            client.change_bid(999_999_999, 1.0)
        for instance_id, price in ((on_demand, 1.0), (iid, 0.0)):
            with pytest.raises(ProviderError) as refused:
                client.change_bid(instance_id, price)
            assert (refused.value.status, refused.value.code) == (400, "invalid_args")
