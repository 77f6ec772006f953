"""hosts.vast without a server: parsers on bodies shaped like the reference's examples
(docs/vast-api.md), the pure decisions, and the retry rules with a fake network edge."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from urllib.parse import parse_qs

import httpx
import pytest

from hosts import vast
from hosts.vast import (
    AuthFailed,
    BidMismatch,
    CreateOutcomeUnknown,
    InstanceGone,
    InsufficientCredit,
    OfferGone,
    OfferRefused,
    ProviderError,
    ProviderUnreachable,
    RateLimited,
    RetryPolicy,
    VastClient,
)

OFFER = {  # one offer as POST /bundles/ returns it (the market file; docs/vast-api.md §2)
    "id": 15509613,
    "ask_contract_id": 15509613,
    "machine_id": 23538,
    "host_id": 38747,
    "gpu_name": "A100 PCIE",
    "num_gpus": 1,
    "gpu_ram": 81920,
    "gpu_total_ram": 81920,
    "compute_cap": 800,
    "cuda_max_good": 12.6,
    "cpu_cores_effective": 12.0,
    "cpu_ram": 257707,
    "disk_space": 371.4,
    "dph_base": 2.391785,
    "min_bid": 0.863,
    "storage_cost": 1.183,
    "inet_down": 1746.7,
    "inet_up": 1622.6,
    "inet_down_cost": 0.00048828125,
    "inet_up_cost": 0.0009765625,
    "internet_down_cost_per_tb": 0.5,
    "internet_up_cost_per_tb": 1.0,
    "reliability": 0.98876,
    "reliability2": 0.98876,
    "verification": "verified",
    "hosting_type": 1,
    "geolocation": "Virginia, US",
    "dlperf": 86.99,
    "rentable": True,
    "rented": False,
}

INSTANCE = {  # one instance as show-one / v1 list return it (ref §4)
    "id": 4242,
    "machine_id": 23538,
    "host_id": 38747,
    "actual_status": "running",
    "intended_status": "running",
    "cur_state": "running",
    "status_msg": "success, running pytorch/pytorch_2.4",
    "label": "nomad-job-7-attempt-1",
    "image_uuid": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
    "extra_env": [["NOMAD_TOKEN", "abc"], ["-p 8000:8000", "1"]],
    "start_date": 1738900800.5,
    "end_date": 1741320000.0,
    "num_gpus": 1,
    "gpu_name": "A100 PCIE",
    "disk_space": 20.0,
    "dph_base": 2.391785,
    "dph_total": 2.424647,
    "storage_cost": 1.183,
    "storage_total_cost": 0.032862,
    "inet_down_cost": 0.00048828125,
    "inet_up_cost": 0.00048828125,
    "min_bid": 0.863,
    "is_bid": False,
    "public_ipaddr": "203.0.113.7",
}

CHARGE = {  # one contract from GET /api/v0/charges/ (ref §6a)
    "start": 1738900800,
    "end": 1739246400,
    "type": "instance",
    "source": "instance-4242",
    "description": "Instance 4242 Charges - 4 days",
    "amount": 37.528,
    "metadata": {"label": "nomad-job-7-attempt-1", "template_id": 11},
    "items": [
        {
            "type": "gpu",
            "source": None,
            "description": "96.000 hours at $0.389/hour",
            "amount": 37.344,
        },
        {"type": "disk", "source": None, "description": "Storage", "amount": 0.184},
    ],
}


# --- offers ---------------------------------------------------------------------------------


def test_it_reads_an_offer_in_our_units():
    offer = vast.parse_offer(OFFER)

    assert offer.id == 15509613
    assert offer.gpu_ram_gb == 80.0  # 81920 MiB
    assert offer.gpu_total_ram_gb == 80.0
    assert offer.cpu_ram_gb == pytest.approx(257707 / 1024)
    assert offer.storage_usd_per_gb_hour == pytest.approx(1.183 / 720)
    assert offer.download_usd_per_gb == 0.00048828125
    assert offer.upload_usd_per_gb == 0.0009765625
    assert offer.inet_down_mbps == 1746.7
    assert offer.dph_base == 2.391785
    assert offer.min_bid == 0.863
    assert offer.verified is True
    assert offer.datacenter is True  # hosting_type 1, as the SDK derives it
    assert offer.compute_cap == 800
    assert offer.raw["ask_contract_id"] == 15509613


def test_it_falls_back_to_per_tb_traffic_prices():
    raw = {"id": 1, "internet_down_cost_per_tb": 2.0, "internet_up_cost_per_tb": 1.2}

    offer = vast.parse_offer(raw)

    assert offer.download_usd_per_gb == 0.001953125
    assert offer.upload_usd_per_gb == pytest.approx(0.001171875)


def test_it_prefers_the_per_gb_traffic_price_even_when_zero():
    raw = {"id": 1, "inet_down_cost": 0, "internet_down_cost_per_tb": 5.0}

    assert vast.parse_offer(raw).download_usd_per_gb == 0.0


def test_it_fills_dph_total_only_from_known_parts():
    with_storage = vast.parse_offer({"id": 1, "dph_base": 0.4, "storage_total_cost": 0.01})
    without = vast.parse_offer({"id": 2, "dph_base": 0.4})

    assert with_storage.dph_total == pytest.approx(0.41)
    assert without.dph_total is None


def test_it_tolerates_an_offer_of_nulls():
    raw = dict.fromkeys(OFFER, None) | {"id": 7}

    offer = vast.parse_offer(raw)

    assert offer.id == 7
    assert offer.gpu_name == ""
    assert offer.dph_base is None
    assert offer.download_usd_per_gb is None
    assert offer.verified is False
    assert offer.datacenter is False


def test_it_multiplies_per_gpu_ram_when_the_total_is_missing():
    offer = vast.parse_offer({"id": 1, "gpu_ram": 24576, "num_gpus": 2})

    assert offer.gpu_total_ram_gb == 48.0


# --- instances ------------------------------------------------------------------------------


def test_it_reads_null_from_show_one_as_gone():
    assert vast.instance_from_show({"instances": None}) is None
    assert vast.instance_from_show(None) is None


def test_it_reads_the_plural_key_holding_one_object():
    instance = vast.instance_from_show({"instances": INSTANCE})

    assert instance is not None
    assert instance.id == 4242
    assert instance.label == "nomad-job-7-attempt-1"
    assert instance.image == "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"


def test_it_reads_instance_times_as_aware_utc_and_env_as_a_dict():
    instance = vast.parse_instance(INSTANCE)

    assert instance.start_date == datetime(2025, 2, 7, 4, 0, 0, 500000, tzinfo=UTC)
    assert instance.start_date.tzinfo is UTC
    assert instance.env == {"NOMAD_TOKEN": "abc", "-p 8000:8000": "1"}
    assert instance.is_bid is False
    assert instance.storage_usd_per_gb_hour == pytest.approx(1.183 / 720)
    assert instance.dph_total == 2.424647


def test_it_tolerates_an_instance_still_provisioning():
    instance = vast.parse_instance({"id": 9, "actual_status": None, "start_date": None})

    assert instance.actual_status is None
    assert instance.start_date is None
    assert instance.env == {}
    assert instance.is_bid is None


def test_it_reports_absent_and_released_instances_as_gone():
    listed = [
        vast.parse_instance(INSTANCE),
        vast.parse_instance({"id": 5, "cur_state": "unloaded", "actual_status": "exited"}),
        vast.parse_instance({"id": 6, "cur_state": "stopped", "actual_status": "stopped"}),
    ]

    states = vast.instance_presence([4242, 5, 6, 77], listed)

    assert not states[4242].gone
    assert states[4242].actual_status == "running"
    assert states[5].gone
    assert not states[6].gone
    assert states[77].gone
    assert states[77].instance is None


# --- charges and invoices ---------------------------------------------------------------------


def test_it_reads_a_charge_contract_with_its_items():
    charge = vast.parse_charge(CHARGE)

    assert charge.instance_id == 4242
    assert charge.label == "nomad-job-7-attempt-1"
    assert charge.amount == Decimal("37.528")
    assert charge.start == datetime(2025, 2, 7, 4, 0, tzinfo=UTC)
    gpu, disk = charge.items
    assert (gpu.type, gpu.quantity, gpu.unit, gpu.rate) == (
        "gpu",
        Decimal("96.000"),
        "hours",
        Decimal("0.389"),
    )
    assert gpu.amount == Decimal("37.344")
    assert (disk.quantity, disk.rate) == (None, None)  # wording without numbers: unknown
    assert sum(i.amount for i in charge.items) == charge.amount


@pytest.mark.parametrize(
    ("description", "quantity", "unit", "rate", "rate_unit"),
    [
        ("0.250 hours at $0.389/hour", "0.250", "hours", "0.389", "hour"),
        # Vast's billing page, a storage item: the whole disk's hours at its $/hour.
        ("0.9765233 hours at $0.018/hour", "0.9765233", "hours", "0.018", "hour"),
        ("12.5 GB at $0.0020/GB", "12.5", "GB", "0.0020", "GB"),
        ("3.210 GB downloaded at $0.000488/GB", "3.210", "GB", "0.000488", "GB"),
        ("1,200.000 GB-hours at $ 0.0016 per GB-hour", "1200.000", "GB-hours", "0.0016", "GB-hour"),
        ("Download traffic", None, None, None, None),
        ("Storage for 10.0 GB", None, None, None, None),
        ("", None, None, None, None),
    ],
)
def test_it_parses_quantity_and_rate_from_item_descriptions(
    description, quantity, unit, rate, rate_unit
):
    item = vast.parse_charge_item({"type": "bwd", "amount": "0.025", "description": description})

    assert item.quantity == (Decimal(quantity) if quantity else None)
    assert item.unit == unit
    assert item.rate == (Decimal(rate) if rate else None)
    assert item.rate_unit == rate_unit
    assert item.amount == Decimal("0.025")


def test_it_reads_monthly_storage_rates_as_gb_hours_in_our_units():
    item = vast.parse_charge_item(
        {
            "type": "disk",
            "amount": 0.005,
            "description": "10.0 GB for 2.400 hours at $0.150/GB/month",
        }
    )

    assert item.quantity == Decimal("24.0000")
    assert item.unit == "GB-hours"
    assert item.rate == Decimal("0.150") / 720
    assert item.rate_unit == "GB-hour"
    assert item.quantity * item.rate == pytest.approx(Decimal("0.005"))


def test_it_keeps_non_instance_charge_sources_without_an_instance_id():
    charge = vast.parse_charge({"source": "endpoint-12", "amount": None, "items": None})

    assert charge.instance_id is None
    assert charge.amount == Decimal(0)
    assert charge.items == ()


def test_it_turns_a_top_up_positive_and_keeps_transfer_signs():
    top_up = {  # ref §6b: the docs' $25 Stripe top-up arrives as -25.0
        "start": 1738900800,
        "end": 1738900900,
        "type": "credit",
        "source": "stripe",
        "description": "Card top-up",
        "amount": -25.0,
        "metadata": {"invoice_id": 991, "service": "stripe_payments"},
        "items": [],
    }
    transfer = {"type": "transfer", "amount": 10.0, "start": 1738900800, "end": None}

    credit_row = vast.parse_invoice_row(top_up)
    transfer_row = vast.parse_invoice_row(transfer)

    assert credit_row.amount == Decimal("25.0")
    assert credit_row.raw_amount == Decimal("-25.0")
    assert credit_row.invoice_id == "991"
    assert credit_row.service == "stripe_payments"
    assert credit_row.paid_at == datetime(2025, 2, 7, 4, 1, 40, tzinfo=UTC)
    assert transfer_row.amount == Decimal("10.0")
    assert transfer_row.paid_at is None


# --- errors ---------------------------------------------------------------------------------

# vast-ai/docs create_instance.yaml, the 403 example: a refusal of that one offer.
NOT_YOUR_OWN = {
    "success": False,
    "error": "invalid_args",
    "msg": "error 403/3586: Offer 1234567 is not your own. Hosts can only rent their own machines.",
    "ask_id": 1234567,
}


@pytest.mark.parametrize(
    ("status", "body", "kind", "code", "message"),
    [
        (
            401,
            '{"success": false, "error": "auth_error", "msg": "Invalid user key"}',
            AuthFailed,
            "auth_error",
            "Invalid user key",
        ),
        (403, '{"detail": "This action requires login."}', AuthFailed, None, "requires login"),
        (
            404,
            '{"success": false, "error": "auth_error", "msg": "Invalid user key"}',
            AuthFailed,
            "auth_error",
            "Invalid user key",
        ),
        (
            404,
            '{"success": false, "error": "no_such_ask", "msg": "error 404/3603: no such ask"}',
            OfferGone,
            "no_such_ask",
            "no such ask",
        ),
        (410, '{"error": "no_such_ask", "msg": "gone", "ask_id": 5}', OfferGone, "no_such_ask", ""),
        (
            400,
            '{"success": false, "error": "insufficient_credit", "msg": "Top up"}',
            InsufficientCredit,
            "insufficient_credit",
            "Top up",
        ),
        (
            400,
            '{"error": "missing_billing", "message": "No card"}',
            InsufficientCredit,
            "missing_billing",
            "No card",
        ),
        (
            404,
            '{"success": false, "error": "no_such_instance", "msg": "no"}',
            InstanceGone,
            "no_such_instance",
            "no",
        ),
        (429, "API requests too frequent", RateLimited, None, "too frequent"),
        (429, '{"detail": "Too many requests"}', RateLimited, None, "Too many"),
        (400, '{"error": "invalid_args", "msg": "bad disk"}', ProviderError, "invalid_args", "bad"),
        (500, "<html>Internal Server Error</html>", ProviderError, None, "Internal"),
        # A 403 that names no key refuses what was asked, not the account (create_instance.yaml).
        (403, json.dumps(NOT_YOUR_OWN), ProviderError, "invalid_args", "is not your own"),
    ],
)
def test_it_types_error_bodies_in_their_various_shapes(status, body, kind, code, message):
    error = vast.error_for(status, body)

    assert type(error) is kind
    assert isinstance(error, vast.VastError)
    assert error.status == status
    assert error.code == code
    assert message in error.message
    assert error.body == body


def test_it_reads_the_endpoint_threshold_from_a_plain_text_429():
    error = vast.error_for(429, "API requests too frequent: endpoint threshold=4.5")

    assert isinstance(error, RateLimited)
    assert error.retry_after == 4.5


# --- request bodies and parameters --------------------------------------------------------------


def test_it_adds_the_sdk_search_defaults_unless_told_not_to():
    query = {"gpu_name": {"eq": "RTX 4090"}, "verified": {"eq": False}}

    body = vast.build_search_body(query, type="interruptible", limit=50, allocated_storage=20)
    bare = vast.build_search_body(query, no_default=True)

    assert body["gpu_name"] == {"eq": "RTX 4090"}
    assert body["verified"] == {"eq": False}  # the caller's choice wins
    assert body["external"] == {"eq": False}
    assert body["rentable"] == {"eq": True}
    assert body["rented"] == {"eq": False}
    assert body["type"] == "bid"
    assert body["order"] == [["score", "desc"]]
    assert (body["limit"], body["allocated_storage"]) == (50, 20)
    assert "rentable" not in bare
    assert bare["type"] == "on-demand"


def test_it_sends_a_bid_price_only_for_interruptible_rentals():
    common = {"image": "img", "disk_gb": 20, "label": "x", "onstart": "run", "runtype": "ssh"}

    bid = vast.build_create_body(**common, env={"A": "b"}, bid_usd_per_hour=0.3)
    on_demand = vast.build_create_body(**common, env=None, bid_usd_per_hour=None)

    assert bid["price"] == 0.3
    assert bid["env"] == {"A": "b"}
    assert bid["disk"] == 20
    assert "price" not in on_demand
    assert on_demand["env"] == {}


def test_a_registry_login_goes_in_the_create_body_only_when_there_is_one():
    common = {"image": "ghcr.io/a/b:1", "disk_gb": 20, "label": "l", "onstart": "", "env": None}
    common |= {"runtype": "ssh", "bid_usd_per_hour": None}

    private = vast.build_create_body(**common, image_login="-u bot -p t0ken ghcr.io")
    public = vast.build_create_body(**common)

    assert private["image_login"] == "-u bot -p t0ken ghcr.io"  # ref §3
    assert "image_login" not in public


def test_it_refuses_a_bid_outside_vasts_range():
    with pytest.raises(ValueError, match="range"):
        vast.build_create_body(
            image="i", disk_gb=8, label="l", onstart="", env=None, runtype="ssh", bid_usd_per_hour=0
        )


def test_it_encodes_structured_query_params_as_json_and_strings_as_is():
    params = vast.encode_params(
        {"owner": "me", "limit": 25, "latest_first": True, "select_filters": {"id": {"eq": 1}}}
    )

    assert params == {
        "owner": "me",
        "limit": "25",
        "latest_first": "true",
        "select_filters": '{"id": {"eq": 1}}',
    }


# --- the client at a fake network edge -----------------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


class Edge:
    """A scripted Vast: answers in order, records requests and the sleeps the client asked for."""

    def __init__(self, *answers: httpx.Response | Exception | Handler) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer

    def client(self, rand: float = 0.0, **kwargs) -> VastClient:
        return VastClient(
            "secret-key",
            "https://vast.test",
            transport=httpx.MockTransport(self),
            sleep=self.sleeps.append,
            rand=lambda: rand,
            **kwargs,
        )

    def query(self, index: int) -> dict[str, str]:
        query = parse_qs(self.requests[index].url.query.decode())
        return {k: v[0] for k, v in query.items()}

    def body(self, index: int) -> dict:
        return json.loads(self.requests[index].content)


def ok(payload: object, status: int = 200, **kwargs) -> httpx.Response:
    return httpx.Response(status, json=payload, **kwargs)


def text(status: int, body: str, **kwargs) -> httpx.Response:
    return httpx.Response(status, text=body, **kwargs)


def test_it_sends_the_bearer_key_and_reads_offers():
    edge = Edge(ok({"offers": [OFFER]}))

    offers = edge.client().search_offers({"num_gpus": {"gte": 1}}, limit=5)

    request = edge.requests[0]
    assert request.headers["Authorization"] == "Bearer secret-key"
    assert (request.method, request.url.path) == ("POST", "/api/v0/bundles/")
    assert edge.body(0)["num_gpus"] == {"gte": 1}
    assert [o.id for o in offers] == [15509613]


def test_it_waits_out_the_endpoint_threshold_of_a_plain_text_429():
    too_fast = text(429, "API requests too frequent: endpoint threshold=4.5")
    edge = Edge(too_fast, too_fast, ok({"offers": []}))

    assert edge.client().search_offers() == []
    assert edge.sleeps == [4.5, 4.5]


def test_it_backs_off_exponentially_on_gateway_errors_then_gives_up():
    edge = Edge(*[text(503, "unavailable")] * 5)

    with pytest.raises(ProviderError) as raised:
        edge.client().current_user()

    assert raised.value.status == 503
    assert len(edge.requests) == 5
    assert edge.sleeps == [0.5, 1.0, 2.0, 4.0]


def test_it_adds_jitter_on_top_of_the_backoff():
    edge = Edge(text(502, "bad gateway"), ok({"id": 1}))

    edge.client(rand=1.0).current_user()

    assert edge.sleeps == [0.5 * 1.25]


def test_it_honours_retry_after():
    edge = Edge(text(429, "slow down", headers={"Retry-After": "3"}), ok({"id": 1, "credit": 5}))

    user = edge.client().current_user()

    assert user.credit == 5.0
    assert edge.sleeps == [3.0]


def test_it_gives_up_at_once_when_retry_after_exceeds_a_minute():
    edge = Edge(text(429, "slow down", headers={"Retry-After": "120"}))

    with pytest.raises(RateLimited) as raised:
        edge.client().current_user()

    assert raised.value.retry_after == 120.0
    assert edge.sleeps == []


def test_it_does_not_retry_an_exhausted_search_quota():
    quota = {"success": False, "error": "search_quota_exceeded", "msg": "Daily quota"}
    edge = Edge(ok(quota, status=429))

    with pytest.raises(RateLimited) as raised:
        edge.client().search_offers()

    assert raised.value.code == "search_quota_exceeded"
    assert len(edge.requests) == 1


def test_it_retries_connection_errors_on_safe_calls():
    edge = Edge(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), ok({"instances": None}))

    assert edge.client().show_instance(1) is None
    assert edge.sleeps == [0.5, 1.0]


def test_it_raises_unreachable_when_the_network_stays_down():
    edge = Edge(*[httpx.ConnectError("refused")] * 2)

    with pytest.raises(ProviderUnreachable):
        edge.client(retry=RetryPolicy(attempts=2)).current_user()


def test_it_lists_every_page_with_json_encoded_filters():
    first = {"success": True, "instances": [INSTANCE], "next_token": "t1"}
    last = {"success": True, "instances": [INSTANCE | {"id": 4243}], "next_token": None}
    edge = Edge(ok(first), ok(last))

    instances = edge.client().list_instances(label="nomad-job-7-attempt-1")

    assert [i.id for i in instances] == [4242, 4243]
    assert edge.requests[0].url.path == "/api/v1/instances/"
    assert json.loads(edge.query(0)["select_filters"]) == {"label": {"eq": "nomad-job-7-attempt-1"}}
    assert "after_token" not in edge.query(0)
    assert edge.query(1)["after_token"] == "t1"
    assert edge.query(1)["select_filters"] == edge.query(0)["select_filters"]


def test_it_keeps_charge_filters_identical_between_pages():
    first = {"success": True, "count": 1, "results": [CHARGE], "next_token": "n1"}
    last = {"success": True, "count": 1, "results": [CHARGE], "next_token": None}
    edge = Edge(ok(first), ok(last))
    start, end = datetime(2025, 2, 7, tzinfo=UTC), datetime(2025, 2, 11, tzinfo=UTC)

    charges = edge.client().charges(start, end)

    assert len(charges) == 2
    assert json.loads(edge.query(0)["select_filters"]) == {
        "day": {"gte": 1738886400, "lte": 1739232000}
    }
    assert {k: v for k, v in edge.query(1).items() if k != "after_token"} == edge.query(0)


def test_it_refuses_a_naive_window():
    with pytest.raises(ValueError, match="aware"):
        Edge().client().charges(datetime(2025, 2, 7), datetime(2025, 2, 8))


def test_it_raises_on_an_invalid_invoice_range_answered_with_200():
    body = {"success": False, "error": "Invalid date range", "count": 0, "results": []}
    edge = Edge(ok(body))
    now = datetime.now(UTC)

    with pytest.raises(ProviderError, match="Invalid date range"):
        edge.client().invoices(now, now)


def test_it_reports_a_start_on_a_busy_machine_as_queued():
    busy = {"success": False, "error": "resources_unavailable", "msg": "state change queued."}
    edge = Edge(ok(busy), ok({"success": True}))
    client = edge.client()

    started = client.start_instance(4242)
    stopped = client.stop_instance(4242)

    assert started.queued
    assert "queued" in started.message
    assert not stopped.queued
    assert edge.body(0) == {"state": "running"}
    assert edge.body(1) == {"state": "stopped"}


def test_it_treats_destroying_a_gone_instance_as_done():
    gone = {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
    edge = Edge(ok({"success": True}), ok(gone, status=404))
    client = edge.client()

    assert client.destroy_instance(1) is True
    assert client.destroy_instance(1) is False


def test_it_reads_the_hand_written_docs_not_found_on_destroy_as_gone_once_show_agrees():
    not_found = {"success": False, "error": "not_found", "msg": "Instance not found"}
    edge = Edge(ok(not_found, status=404), ok({"instances": None}))

    assert edge.client().destroy_instance(1) is False
    assert [(r.method, r.url.path) for r in edge.requests] == [
        ("DELETE", "/api/v0/instances/1/"),
        ("GET", "/api/v0/instances/1/"),
    ]


def test_it_does_not_take_not_found_for_gone_while_the_instance_still_shows():
    not_found = {"success": False, "error": "not_found", "msg": "no endpoint"}
    edge = Edge(ok(not_found, status=404), ok({"instances": INSTANCE}))

    with pytest.raises(ProviderError) as raised:
        edge.client().destroy_instance(4242)

    assert raised.value.code == "not_found"


def test_it_reports_instance_states_from_one_full_listing():
    page = {"success": True, "instances": [INSTANCE], "next_token": None}
    edge = Edge(ok(page))

    states = edge.client().instance_states([4242, 999])

    assert len(edge.requests) == 1
    assert not states[4242].gone
    assert states[999].gone


def test_it_takes_url_and_key_from_the_team_else_from_settings(settings):
    settings.VAST_URL, settings.VAST_API_KEY = "http://sandbox.test:8700", "server-key"
    team = SimpleNamespace(vast_url="https://console.vast.ai/", vast_api_key="team-key")
    bare_team = SimpleNamespace(vast_url="", vast_api_key="")

    assert VastClient.from_settings(team).base_url == "https://console.vast.ai"
    assert VastClient.from_settings(bare_team).base_url == "http://sandbox.test:8700"
    assert VastClient.from_settings().base_url == "http://sandbox.test:8700"
    for source, key in ((team, "team-key"), (bare_team, "server-key")):
        edge = Edge(ok({"id": 1}))
        VastClient.from_settings(source, transport=httpx.MockTransport(edge)).current_user()
        assert edge.requests[0].headers["Authorization"] == f"Bearer {key}"


# --- create: the call that must never be retried blindly ----------------------------------------

CREATED = {"success": True, "new_contract": 4242, "instance_api_key": "ik"}


def create(client: VastClient, **kwargs):
    args = {"image": "img", "disk_gb": 20, "label": "nomad-job-7-attempt-1", "onstart": "run"}
    return client.create_instance(15509613, **(args | kwargs))


def test_it_creates_and_checks_is_bid_against_the_request():
    edge = Edge(ok(CREATED), ok({"instances": INSTANCE | {"is_bid": True}}))

    created = create(edge.client(), bid_usd_per_hour=0.9, env={"NOMAD_TOKEN": "abc"})

    assert created.id == 4242
    assert created.is_bid is True
    assert created.instance_api_key == "ik"
    assert (edge.requests[0].method, edge.requests[0].url.path) == ("PUT", "/api/v0/asks/15509613/")
    assert edge.body(0)["price"] == 0.9
    assert edge.body(0)["env"] == {"NOMAD_TOKEN": "abc"}
    assert edge.requests[1].url.path == "/api/v0/instances/4242/"
    assert edge.query(1) == {"owner": "me"}


def test_it_destroys_an_instance_that_fell_into_the_bid_trap():
    edge = Edge(ok(CREATED), ok({"instances": INSTANCE | {"is_bid": False}}), ok({"success": True}))

    with pytest.raises(BidMismatch) as raised:
        create(edge.client(), bid_usd_per_hour=0.9)

    assert raised.value.instance_id == 4242
    assert raised.value.destroyed
    assert (edge.requests[2].method, edge.requests[2].url.path) == (
        "DELETE",
        "/api/v0/instances/4242/",
    )


def test_it_returns_an_unverified_creation_rather_than_losing_its_id():
    edge = Edge(ok(CREATED), ok({"instances": None}))

    created = create(edge.client())

    assert created.id == 4242
    assert created.is_bid is None


def test_it_never_resends_a_create_after_a_read_timeout():
    edge = Edge(httpx.ReadTimeout("no answer"))

    with pytest.raises(CreateOutcomeUnknown) as raised:
        create(edge.client())

    assert raised.value.label == "nomad-job-7-attempt-1"
    assert len(edge.requests) == 1
    assert edge.sleeps == []


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_it_never_resends_a_create_after_a_server_error(status):
    edge = Edge(text(status, "upstream trouble"))

    with pytest.raises(CreateOutcomeUnknown) as raised:
        create(edge.client())

    assert raised.value.status == status
    assert len(edge.requests) == 1


def test_it_resends_a_create_that_never_connected_or_was_rate_limited():
    edge = Edge(
        httpx.ConnectError("refused"),
        text(429, "API requests too frequent: endpoint threshold=4.5"),
        ok(CREATED),
        ok({"instances": INSTANCE}),
    )

    created = create(edge.client())

    assert created.id == 4242
    assert created.is_bid is False
    assert edge.sleeps == [0.5, 12.0]  # a create's 429 waits out Vast's penalty, not the 4.5 s


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (404, {"error": "no_such_ask", "msg": "gone"}, OfferGone),  # the generated spec
        (404, {"error": "invalid_args", "msg": "error 404/3603: no_such_ask ..."}, OfferGone),
        (400, {"error": "invalid_args", "msg": "billing issue: add credit"}, InsufficientCredit),
        (400, {"error": "missing_billing", "msg": "no card"}, InsufficientCredit),
        (400, {"error": "invalid_args", "msg": "disk must be at least 8 GB"}, ProviderError),
        (403, NOT_YOUR_OWN, OfferRefused),
        (400, {"error": "invalid_price", "msg": "quote is stale: search again"}, OfferRefused),
        (403, {"msg": "This action requires login."}, AuthFailed),
        (403, {"error": "invalid_args", "msg": "API key lacks instance_write"}, AuthFailed),
        (401, {"error": "auth_error", "msg": "Invalid user key"}, AuthFailed),
    ],
)
def test_create_errors_are_read_in_both_of_vasts_spellings(status, body, kind):
    edge = Edge(ok({"success": False, **body}, status=status))

    with pytest.raises(kind) as raised:
        create(edge.client())

    assert type(raised.value) is kind


@pytest.mark.parametrize("status", [404, 410])
def test_it_reports_a_taken_offer_as_gone(status):
    edge = Edge(ok({"success": False, "error": "no_such_ask", "msg": "gone"}, status=status))

    with pytest.raises(OfferGone):
        create(edge.client())


def test_it_reports_a_bare_404_on_the_ask_as_gone_but_not_a_wrong_path():
    bare = Edge(text(404, "Not Found"))
    wrong_path = Edge(ok({"success": False, "error": "not_found", "msg": "no endpoint"}, 404))

    with pytest.raises(OfferGone):
        create(bare.client())
    with pytest.raises(ProviderError) as raised:
        create(wrong_path.client())
    assert raised.value.code == "not_found"


def test_a_refusal_of_one_offer_names_the_offer_vast_named_and_keeps_its_words():
    edge = Edge(ok(NOT_YOUR_OWN, status=403))

    with pytest.raises(OfferRefused) as raised:
        create(edge.client())

    assert raised.value.offer_id == 1234567  # Vast's ask_id, not the one asked for
    assert raised.value.status == 403
    assert raised.value.message.startswith("error 403/3586: Offer 1234567 is not your own")
    assert not isinstance(raised.value, AuthFailed)


def test_it_reports_a_refused_create_answered_with_200():
    edge = Edge(ok({"success": False, "error": "insufficient_credit", "msg": "no money"}))

    with pytest.raises(InsufficientCredit):
        create(edge.client())


def test_it_marks_an_instance_created_stopped():
    edge = Edge(ok(CREATED | {"success": False}), ok({"instances": INSTANCE}))

    assert create(edge.client()).created_stopped
