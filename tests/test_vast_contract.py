"""hosts.vast against the sandbox marketplace over real HTTP: every call the client makes.

The sandbox (``tests.support.sandbox``) speaks Vast's REST API in a subprocess; these tests
prove the client's requests are understood and its parsers read the answers. Waiting is
polling with a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hosts.selection import ON_DEMAND, SEARCH_LIMIT, Requirements, vast_query
from hosts.vast import (
    AuthFailed,
    Instance,
    InsufficientCredit,
    OfferGone,
    RateLimited,
    RetryPolicy,
    VastClient,
    VastError,
)
from sandbox.timing import Timing
from tests.support.processes import wait_until
from tests.support.sandbox import DEFAULT_KEY, Sandbox, market_offers

SLEEP_ONSTART = "exec sleep 120\n"
IMAGE = "ubuntu:22.04"


def client_for(box: Sandbox, key: str = DEFAULT_KEY, **kwargs) -> VastClient:
    return VastClient(key, box.url, **kwargs)


def cheapest(client: VastClient, count: int = 1, **query: dict) -> list[int]:
    offers = client.search_offers(query, order=[["dph_total", "asc"]], limit=count)
    assert len(offers) == count, f"the sandbox market has fewer than {count} such offers"
    return [o.id for o in offers]


def rent(client: VastClient, offer_id: int, label: str, **kwargs) -> int:
    created = client.create_instance(
        offer_id, image=IMAGE, disk_gb=10, label=label, onstart=SLEEP_ONSTART, **kwargs
    )
    return created.id


def wait_for_status(client: VastClient, instance_id: int, status: str) -> Instance:
    def reached() -> Instance | None:
        instance = client.show_instance(instance_id)
        return instance if instance and instance.actual_status == status else None

    return wait_until(reached, timeout=20, what=f"instance {instance_id} to be {status}", every=0.1)


def today_midnight() -> datetime:
    """Where a charges window starts: Vast keys each contract's day row at 00:00 UTC."""
    return datetime.combine(datetime.now(UTC).date(), datetime.min.time(), tzinfo=UTC)


def recording_sleep() -> tuple[list[float], Callable[[float], None]]:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    return slept, sleep


# ---- search ------------------------------------------------------------------------------------


def test_search_filters_orders_and_converts_units(sandbox: Sandbox):
    client = client_for(sandbox)
    query = {"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": 1}, "reliability": {"gte": 0.9}}

    offers = client.search_offers(query, order=[["dph_total", "asc"]], limit=5)

    assert 0 < len(offers) <= 5
    assert {o.gpu_name for o in offers} == {"RTX 4090"}
    assert all(o.reliability >= 0.9 and o.verified for o in offers)
    prices = [o.dph_total for o in offers]
    assert prices == sorted(prices)
    market = market_offers()
    for offer in offers:
        source = market[offer.id]
        assert offer.gpu_ram_gb == pytest.approx(source["gpu_ram"] / 1024)
        assert offer.storage_usd_per_gb_hour == pytest.approx(source["storage_cost"] / 720)
        assert offer.download_usd_per_gb == pytest.approx(source["inet_down_cost"])
        assert offer.inet_down_mbps == pytest.approx(source["inet_down"])
        assert offer.dph_base == pytest.approx(source["dph_base"])


def test_the_jobs_search_asks_for_every_offer_and_any_verification_by_dropping_the_key(
    sandbox: Sandbox,
):
    client = client_for(sandbox)
    loose = Requirements(
        rental=ON_DEMAND,
        gpu_names=(),
        min_reliability=0.0,
        min_inet_down_mbps=0,
        disk_gb=8,
        verified_only=False,
    )

    def search(req: Requirements, **kw) -> list:
        return client.search_offers(vast_query(req), allocated_storage=req.disk_gb, **kw)

    every = search(loose, limit=SEARCH_LIMIT)
    verified = search(replace(loose, verified_only=True), limit=SEARCH_LIMIT)

    assert len(search(loose)) == 64  # without a limit the server picks how many (sandbox: 64)
    assert len(every) > 64  # the cost ranking sees all of them, not the top by Vast's score
    assert any(not o.verified for o in every)
    assert verified
    assert all(o.verified for o in verified)
    assert len(verified) < len(every)


def test_search_without_defaults_and_for_interruptible_offers(sandbox: Sandbox):
    client = client_for(sandbox)

    everything = client.search_offers(no_default=True, limit=1000)
    bids = client.search_offers({"num_gpus": {"gte": 1}}, type="interruptible", limit=10)

    assert len(everything) >= len(client.search_offers(limit=1000))
    assert bids
    assert all(o.min_bid is not None for o in bids)


# ---- rent and manage -----------------------------------------------------------------------------


def test_an_instance_lives_from_create_to_destroy(sandbox: Sandbox):
    client = client_for(sandbox)
    (offer_id,) = cheapest(client)

    created = client.create_instance(
        offer_id,
        image=IMAGE,
        disk_gb=10,
        label="contract-life",
        onstart=SLEEP_ONSTART,
        env={"NOMAD_HELLO": "1"},
    )

    assert created.is_bid is False
    assert created.instance_api_key
    shown = wait_for_status(client, created.id, "running")
    assert shown.label == "contract-life"
    assert shown.env.get("NOMAD_HELLO") == "1"
    assert shown.start_date.tzinfo is not None

    client.label_instance(created.id, "contract-life-renamed")
    assert client.show_instance(created.id).label == "contract-life-renamed"

    assert not client.stop_instance(created.id).queued
    wait_for_status(client, created.id, "stopped")
    assert not client.start_instance(created.id).queued
    wait_for_status(client, created.id, "running")

    assert client.destroy_instance(created.id) is True
    assert client.show_instance(created.id) is None
    assert client.instance_states([created.id])[created.id].gone
    assert client.destroy_instance(created.id) is False  # repeating is harmless


def test_an_interruptible_rental_is_a_bid_and_can_be_queued(sandbox: Sandbox):
    client = client_for(sandbox)
    offer = client.search_offers(type="bid", order=[["min_bid", "asc"]], limit=1)[0]

    created = client.create_instance(
        offer.id,
        image=IMAGE,
        disk_gb=10,
        label="contract-bid",
        onstart=SLEEP_ONSTART,
        bid_usd_per_hour=round(offer.min_bid + 0.05, 3),
    )
    assert created.is_bid is True
    wait_for_status(client, created.id, "running")

    sandbox.inject(created.id, "outbid")
    wait_for_status(client, created.id, "stopped")
    change = client.start_instance(created.id)

    assert change.queued  # resources_unavailable: Vast waits for the GPU
    assert client.show_instance(created.id).intended_status == "running"


def test_listing_reads_every_page_past_25(sandbox: Sandbox):
    client = client_for(sandbox)
    offer_ids = cheapest(client, 27)
    ids = [rent(client, offer_id, f"contract-page-{n}") for n, offer_id in enumerate(offer_ids)]

    listed = client.list_instances()
    one = client.list_instances(label="contract-page-3")

    assert sorted(i.id for i in listed) == sorted(ids)
    assert [i.id for i in one] == [ids[3]]
    states = client.instance_states([*ids, 1])
    assert [states[i].gone for i in ids] == [False] * 27
    assert states[1].gone


def test_two_clients_racing_for_one_ask_get_one_instance(sandbox_factory):
    box = sandbox_factory(keys=("key-a", "key-b"))
    clients = [client_for(box, "key-a"), client_for(box, "key-b")]
    (offer_id,) = cheapest(clients[0])
    start = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def race(n: int) -> None:
        start.wait()
        try:
            outcomes[n] = rent(clients[n], offer_id, f"racer-{n}")
        except VastError as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=race, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(type(o).__name__ for o in outcomes) == ["OfferGone", "int"]


def test_renting_a_taken_ask_is_offer_gone(sandbox: Sandbox):
    client = client_for(sandbox)
    (offer_id,) = cheapest(client)
    rent(client, offer_id, "first")

    with pytest.raises(OfferGone) as taken:
        rent(client, offer_id, "second")
    with pytest.raises(OfferGone) as unknown:
        rent(client, 1, "never-listed")

    # Vast's two sources disagree on the code of this 404; both mean "try the next offer".
    assert (taken.value.status, taken.value.code) == (404, "invalid_args")
    assert "no_such_ask" in taken.value.message
    assert (unknown.value.status, unknown.value.code) == (404, "no_such_ask")


def test_renting_without_credit_is_insufficient_credit(sandbox_factory):
    box = sandbox_factory("--credit", "0")
    client = client_for(box)
    (offer_id,) = cheapest(client)

    with pytest.raises(InsufficientCredit):
        rent(client, offer_id, "broke")


# ---- billing and account -------------------------------------------------------------------------


@pytest.mark.slow
def test_charges_read_every_page_past_100(sandbox_factory):
    box = sandbox_factory("--credit", "1000")
    client = client_for(box)
    began = today_midnight()
    offer_ids = cheapest(client, 101, num_gpus={"gte": 1})
    ids = set()
    for n, offer_id in enumerate(offer_ids):
        instance_id = rent(client, offer_id, f"contract-charge-{n}")
        ids.add(instance_id)
        client.destroy_instance(instance_id)

    charges = client.charges(began, datetime.now(UTC) + timedelta(minutes=1))

    assert {c.instance_id for c in charges} == ids
    assert len(charges) == 101
    labelled = {c.label for c in charges}
    assert "contract-charge-0" in labelled
    for charge in charges:
        assert charge.start.tzinfo is not None
        assert {i.type for i in charge.items} <= {"gpu", "disk", "bwd", "bwu"}


def test_charges_itemise_a_running_instance(sandbox: Sandbox):
    client = client_for(sandbox)
    began = today_midnight()
    (offer_id,) = cheapest(client)
    instance_id = rent(client, offer_id, "contract-bill")
    wait_for_status(client, instance_id, "running")

    def billed_gpu_time():
        charges = client.charges(began, datetime.now(UTC) + timedelta(minutes=1))
        gpu = [i for c in charges for i in c.items if i.type == "gpu" and i.quantity]
        return charges if gpu else None

    (charge,) = wait_until(billed_gpu_time, timeout=20, what="GPU time on the invoice", every=0.2)

    assert charge.instance_id == instance_id
    assert charge.label == "contract-bill"
    by_type = {i.type: i for i in charge.items}
    assert {"gpu", "disk"} <= set(by_type)
    for item in by_type.values():
        assert item.quantity is not None, item.description
        assert item.rate is not None, item.description
    assert by_type["gpu"].unit == "hours"
    assert (by_type["disk"].unit, by_type["disk"].rate_unit) == ("hours", "hour")  # Vast's wording


def test_invoices_show_the_opening_top_up_as_money_in(sandbox: Sandbox):
    client = client_for(sandbox)
    now = datetime.now(UTC)

    rows = client.invoices(now - timedelta(days=1), now + timedelta(minutes=1))

    assert rows
    top_up = rows[0]
    assert top_up.amount > 0
    assert top_up.raw_amount == -top_up.amount
    assert top_up.created_at is not None


def test_current_user_reports_the_spendable_credit(sandbox: Sandbox):
    user = client_for(sandbox).current_user()

    assert user.id is not None
    assert user.credit == pytest.approx(100.0, abs=0.01)


def test_a_bad_key_is_auth_failed_on_every_kind_of_endpoint(sandbox: Sandbox):
    client = client_for(sandbox, "not-a-key")
    now = datetime.now(UTC)

    for call in (
        client.current_user,
        client.list_instances,
        lambda: client.show_instance(1),
        lambda: client.charges(now - timedelta(days=1), now),  # Vast answers 404 auth_error
        lambda: client.invoices(now - timedelta(days=1), now),
    ):
        with pytest.raises(AuthFailed):
            call()


# ---- rate limits ---------------------------------------------------------------------------------


def test_the_client_waits_out_vasts_rate_limits(sandbox_factory):
    # Under --fast the sandbox's intervals are Vast's real ones scaled (Timing.rate_interval), so
    # the client meets every 429 a real account would, in a quarter of the time.
    scaled = Timing.fast().rate_interval
    box = sandbox_factory(relaxed=False)
    slept, sleep = recording_sleep()
    # The create penalty (12 s on Vast) scaled like the sandbox's own.
    policy = RetryPolicy(create_penalty_s=scaled(12.0))
    client = client_for(box, sleep=sleep, retry=policy)
    first, second = cheapest(client, 2)

    client.list_instances()
    client.list_instances()  # 1 s interval: 429 "endpoint threshold=0.25", then served
    rent(client, first, "limited-1")
    rent(client, second, "limited-2")  # 4.5 s interval and the penalty: waited out, not failed

    assert len(client.list_instances()) == 2
    assert any(s >= scaled(1.0) for s in slept)
    assert any(s >= scaled(12.0) for s in slept)


def test_a_create_retried_at_the_bare_threshold_meets_the_penalty_again(sandbox_factory):
    scaled = Timing.fast().rate_interval
    box = sandbox_factory(relaxed=False)
    first, second = cheapest(client_for(box), 2)
    hasty = client_for(box, retry=RetryPolicy(attempts=2, create_penalty_s=0.0))
    rent(hasty, first, "hasty-1")

    with pytest.raises(RateLimited):
        rent(hasty, second, "hasty-2")  # waited 4.5 s (scaled), but the penalty was 12

    # A client that waits the penalty out after its 429 gets through (no sleep in the test).
    patient = client_for(box, retry=RetryPolicy(create_penalty_s=scaled(12.0)))
    assert rent(patient, second, "hasty-2") > 0


def block_all_calls(box: Sandbox, seconds: float) -> None:
    reply = box.anon().post("/sandbox/inject", json={"action": "ratelimit", "arg": seconds})
    assert reply.status_code == 200, reply.text


def test_the_client_honours_retry_after_from_the_sandbox(sandbox_factory):
    box = sandbox_factory("--retry-after")
    slept, sleep = recording_sleep()
    client = client_for(box, sleep=sleep)
    block_all_calls(box, 3)

    user = client.current_user()

    assert user.id is not None
    assert slept[0] >= 2.0  # Retry-After, not the 0.5 s first backoff


def test_the_client_gives_up_when_told_to_wait_over_a_minute(sandbox_factory):
    box = sandbox_factory("--retry-after")
    slept, sleep = recording_sleep()
    client = client_for(box, sleep=sleep)
    block_all_calls(box, 120)

    with pytest.raises(RateLimited) as raised:
        client.current_user()

    assert raised.value.retry_after > 60
    assert slept == []
