"""hosts.selection on plain data: filter rules, the cost model, ranking and the decision record.

No server and no database: offers are built with ``hosts.vast.parse_offer`` from dicts shaped
like the sandbox's market file, or loaded from it (``tests.support.market``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hosts import selection
from hosts.selection import (
    ON_DEMAND,
    CannotEstimate,
    JobProfile,
    Requirements,
    SpeedBook,
    choose_offer,
    estimate_cost,
    filter_offers,
    job_dph_total,
    rank_offers,
    transfer_hours,
    vast_query,
)
from hosts.selection.filters import first_failed_rule
from hosts.selection.speed import seconds_per_step
from hosts.vast import Offer, build_search_body, parse_offer
from tests.support.market import FIELD_REPORT_JOB, RAW_OFFER, REFERENCE, load_market, make_offer

TRAP_OFFER_ID = 17179682  # the market's planted trap: the $45/TB host of the cheapest RTX 4090
GIB = 1024**3

FIELD_REPORT_REQ = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=50)


def without(key: str) -> Offer:
    return parse_offer({k: v for k, v in RAW_OFFER.items() if k != key})


# --- the server-side query ---------------------------------------------------------------


def test_query_asks_vast_for_every_requirement_in_its_own_units():
    req = Requirements(
        rental=ON_DEMAND,
        gpu_names=("RTX_4090", "RTX 3090"),
        num_gpus=2,
        min_gpu_ram_gb=20,
        min_reliability=0.97,
        min_inet_down_mbps=800,
        disk_gb=80,
        min_cuda=12.4,
        datacenter_only=True,
        max_dph=1.5,
        avoid_machine_ids=[31, 7],
    )
    assert vast_query(req) == {
        "gpu_name": {"in": ["RTX 4090", "RTX 3090"]},  # spaces on the wire, not underscores
        "num_gpus": {"eq": 2},
        "gpu_ram": {"gte": 20 * 1024},  # Vast's "MB" are MiB
        "reliability": {"gte": 0.97},
        "inet_down": {"gte": 800},
        "disk_space": {"gte": 80},
        "verified": {"eq": True},
        "datacenter": {"eq": True},
        "cuda_max_good": {"gte": 12.4},
        "dph_total": {"lte": 1.5},
        "machine_id": {"notin": [7, 31]},
        "allocated_storage": 80,
    }


def test_query_for_one_model_uses_eq_and_leaves_optional_filters_out():
    query = vast_query(FIELD_REPORT_REQ)
    assert query["gpu_name"] == {"eq": "RTX 4090"}
    assert not {"gpu_ram", "cuda_max_good", "datacenter", "dph_total", "machine_id"} & set(query)


def test_query_allowing_unverified_hosts_drops_the_verified_key_as_the_cli_does():
    body = build_search_body(vast_query(Requirements(rental=ON_DEMAND, verified_only=False)))
    assert "verified" not in body
    assert body["rentable"] == {"eq": True}  # the other defaults stay
    assert body["rentable"] == {"eq": True}  # the other defaults still apply


def test_query_keeps_the_same_offers_as_the_local_filter_on_the_sandbox_engine():
    # The sandbox's query engine, in-process: the prefilter must not drop what filter_offers keeps.
    from sandbox.market import Market

    offers, raw = load_market()
    req = replace(FIELD_REPORT_REQ, min_cuda=12.4, max_dph=0.6, avoid_machine_ids={30941})
    body = build_search_body(vast_query(req), limit=10_000)
    served = Market(list(raw.values())).search(body, rented=set(), gone=set(), now=0.0)
    kept, _ = filter_offers(offers, req)
    assert sorted(o["id"] for o in served) == sorted(o.id for o in kept)
    assert kept  # not vacuous


# --- filter rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "req", "rule"),
    [
        ({}, Requirements(rental=ON_DEMAND, avoid_machine_ids={30941}), "avoid_list"),
        ({"gpu_name": "RTX 3090"}, FIELD_REPORT_REQ, "gpu_name"),
        ({"num_gpus": 2}, Requirements(rental=ON_DEMAND), "num_gpus"),
        (
            {},
            Requirements(rental=ON_DEMAND, min_gpu_ram_gb=24),
            "gpu_ram",
        ),  # 24564 MiB is 23.99 GiB
        ({"verification": "unverified"}, Requirements(rental=ON_DEMAND), "verified"),
        ({}, Requirements(rental=ON_DEMAND, datacenter_only=True), "datacenter"),
        ({"reliability": 0.979}, Requirements(rental=ON_DEMAND), "reliability"),
        ({"inet_down": 499.9}, Requirements(rental=ON_DEMAND), "inet_down"),
        ({"disk_space": 49.0}, Requirements(rental=ON_DEMAND, disk_gb=50), "disk_space"),
        ({"cuda_max_good": 12.2}, Requirements(rental=ON_DEMAND, min_cuda=12.4), "cuda"),
        (
            {"inet_down_cost": None, "internet_down_cost_per_tb": None},
            Requirements(rental=ON_DEMAND),
            "unknown_price",
        ),
        (
            {},
            Requirements(rental=ON_DEMAND, max_dph=0.36),
            "max_dph",
        ),  # 0.36 GPU + 0.01 disk > 0.36
    ],
)
def test_each_rule_rejects_an_offer_that_fails_it(changes, req, rule):
    rejection = first_failed_rule(make_offer(**changes), req)
    assert rejection is not None
    assert (rejection.offer_id, rejection.machine_id, rejection.rule) == (16018470, 30941, rule)
    assert rejection.detail


@pytest.mark.parametrize(
    "req",
    [
        FIELD_REPORT_REQ,
        Requirements(
            rental=ON_DEMAND, min_gpu_ram_gb=23.9, min_cuda=12.4, min_reliability=0.99, disk_gb=1386
        ),
        Requirements(
            rental=ON_DEMAND, verified_only=False, max_dph=0.371, avoid_machine_ids={1, 2}
        ),
        Requirements(rental=ON_DEMAND, gpu_names=("RTX 3090", "RTX_4090"), min_inet_down_mbps=1000),
    ],
)
def test_an_offer_that_meets_every_requirement_passes(req):
    assert first_failed_rule(make_offer(), req) is None


def test_unverified_and_community_hosts_pass_when_not_excluded():
    offer = make_offer(verification="unverified")
    assert first_failed_rule(offer, Requirements(rental=ON_DEMAND, verified_only=False)) is None
    datacenter = Requirements(rental=ON_DEMAND, datacenter_only=True)
    assert first_failed_rule(make_offer(hosting_type=1), datacenter) is None


def test_the_avoid_list_keeps_out_every_listed_machine_and_only_those():
    offers = [make_offer(id=i, machine_id=100 + i) for i in range(1, 5)]
    kept, rejected = filter_offers(
        offers, Requirements(rental=ON_DEMAND, avoid_machine_ids={101, 103})
    )
    assert [o.id for o in kept] == [2, 4]
    assert [(r.offer_id, r.rule) for r in rejected] == [(1, "avoid_list"), (3, "avoid_list")]


def test_an_offer_is_reported_under_the_first_rule_it_fails():
    offer = make_offer(gpu_name="RTX 3090", reliability=0.5, inet_down=10)
    assert first_failed_rule(offer, FIELD_REPORT_REQ).rule == "gpu_name"


def test_max_dph_counts_this_jobs_storage_not_the_offers_search_default():
    offer = make_offer()  # 0.36 $/h + 0.144 / 720 $/GB/h
    assert job_dph_total(offer, 50) == pytest.approx(0.36 + 0.01)
    assert (
        first_failed_rule(offer, Requirements(rental=ON_DEMAND, disk_gb=50, max_dph=0.3705)) is None
    )
    assert (
        first_failed_rule(offer, Requirements(rental=ON_DEMAND, disk_gb=500, max_dph=0.3705)).rule
        == "max_dph"
    )


# --- missing fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "req", "rule"),
    [
        ("reliability", Requirements(rental=ON_DEMAND), "reliability"),
        ("inet_down", Requirements(rental=ON_DEMAND, min_inet_down_mbps=0), "inet_down"),
        ("disk_space", Requirements(rental=ON_DEMAND), "disk_space"),
        ("gpu_ram", Requirements(rental=ON_DEMAND, min_gpu_ram_gb=16), "gpu_ram"),
        ("cuda_max_good", Requirements(rental=ON_DEMAND, min_cuda=12.0), "cuda"),
        ("dph_base", Requirements(rental=ON_DEMAND), "unknown_price"),
        ("storage_cost", Requirements(rental=ON_DEMAND), "unknown_price"),
        ("inet_up_cost", Requirements(rental=ON_DEMAND), "unknown_price"),
        ("gpu_name", FIELD_REPORT_REQ, "gpu_name"),
        ("num_gpus", Requirements(rental=ON_DEMAND), "num_gpus"),
    ],
)
def test_an_offer_missing_a_needed_field_is_rejected_not_guessed(missing, req, rule):
    rejection = first_failed_rule(without(missing), req)
    assert rejection is not None
    assert rejection.rule == rule


def test_fields_no_rule_needs_may_be_missing():
    offer = make_offer(gpu_ram=None, cuda_max_good=None, machine_id=None, geolocation=None)
    assert (
        first_failed_rule(offer, Requirements(rental=ON_DEMAND, avoid_machine_ids={30941})) is None
    )


def test_a_zero_bandwidth_link_is_rejected_even_without_a_minimum():
    assert first_failed_rule(
        make_offer(inet_down=0), Requirements(rental=ON_DEMAND, min_inet_down_mbps=0)
    )


def test_an_offer_without_dlperf_is_timed_from_its_models_typical_dlperf():
    no_dlperf = make_offer(id=2, machine_id=2, dlperf=None)
    peers = [make_offer(id=3, machine_id=3, dlperf=80.0), make_offer(id=4, dlperf=120.0)]
    book = SpeedBook().with_market([no_dlperf, *peers])
    assert seconds_per_step(no_dlperf, FIELD_REPORT_JOB, book) == (4.0, "dlperf-model")


def test_an_offer_whose_contract_ends_before_the_job_could_is_refused():
    needed_h = estimate_cost(
        make_offer(), FIELD_REPORT_JOB, SpeedBook(), Requirements(rental=ON_DEMAND)
    ).wall_h
    short = make_offer(id=2, machine_id=2, duration=needed_h * 3600)  # ends as the job would
    enough = make_offer(id=3, machine_id=3, duration=(needed_h * 1.5 + 1.1) * 3600)
    unknown = make_offer(id=4, machine_id=4, duration=None)

    decision = choose_offer(
        [short, enough, unknown], Requirements(rental=ON_DEMAND), FIELD_REPORT_JOB, top_n=3
    )

    assert decision.rejected_by_rule == {"contract_duration": 1}
    assert {c.offer.id for c in decision.candidates} == {3, 4}
    (why,) = [r.detail for r in rank_rejections([short], FIELD_REPORT_JOB)]
    assert why == f"contract ends in {needed_h:.1f} h; the job needs about {needed_h:.1f} h"


def rank_rejections(offers, profile):
    from hosts.selection.ranking import rank_with_rejections

    return rank_with_rejections(offers, Requirements(rental=ON_DEMAND), profile, None)[1]


def test_an_offer_with_no_way_to_estimate_its_speed_is_rejected_as_unknown_speed():
    odd = make_offer(id=2, machine_id=2, gpu_name="RTX 9999", dlperf=None)
    decision = choose_offer([make_offer(), odd], Requirements(rental=ON_DEMAND), FIELD_REPORT_JOB)
    assert decision.chosen_offer_id == 16018470
    assert decision.rejected_by_rule == {"unknown_speed": 1}
    with pytest.raises(CannotEstimate):
        estimate_cost(odd, FIELD_REPORT_JOB, SpeedBook(), Requirements(rental=ON_DEMAND))


def test_estimating_an_unpriced_offer_directly_raises_instead_of_pricing_it_at_zero():
    with pytest.raises(CannotEstimate):
        estimate_cost(without("dph_base"), FIELD_REPORT_JOB, REFERENCE, FIELD_REPORT_REQ)


def test_a_reference_model_missing_from_the_market_falls_back_to_the_known_dlperf():
    assert seconds_per_step(make_offer(dlperf=50.0), FIELD_REPORT_JOB, SpeedBook()) == (
        8.0,
        "dlperf",
    )
    other = replace(FIELD_REPORT_JOB, reference_gpu="RTX 9999")
    assert seconds_per_step(make_offer(), other, SpeedBook()) is None


# --- speed -----------------------------------------------------------------------------------


def test_machine_speed_beats_model_speed_beats_the_dlperf_estimate():
    offer = make_offer(dlperf=50.0)
    book = SpeedBook(by_machine={30941: 7.0}, by_model={"RTX 4090": 5.0})
    assert seconds_per_step(offer, FIELD_REPORT_JOB, book) == (7.0, "machine")
    assert seconds_per_step(offer, FIELD_REPORT_JOB, replace(book, by_machine={})) == (
        5.0,
        "model",
    )
    assert seconds_per_step(offer, FIELD_REPORT_JOB, REFERENCE) == (8.0, "dlperf")


def test_dlperf_is_compared_per_gpu():
    two = make_offer(num_gpus=2, dlperf=190.0)  # 95 per GPU
    seconds, _ = seconds_per_step(two, FIELD_REPORT_JOB, REFERENCE)
    assert seconds == pytest.approx(4.0 * 100 / 95)


def test_market_calibration_prefers_offers_of_the_jobs_size_and_keeps_given_values():
    offers = [make_offer(dlperf=100.0), make_offer(num_gpus=2, dlperf=150.0)]
    assert SpeedBook().with_market(offers, 1).dlperf_by_model == {"RTX 4090": 100.0}
    assert SpeedBook().with_market(offers, 2).dlperf_by_model == {"RTX 4090": 75.0}
    assert REFERENCE.with_market([make_offer(dlperf=10.0)]).dlperf_by_model["RTX 4090"] == 100.0


def test_a_slow_machine_already_observed_loses_to_a_normal_one_at_equal_price():
    normal = make_offer(id=1, machine_id=11)
    slow = make_offer(id=2, machine_id=22, reliability=0.999)  # wins every tie but speed
    book = SpeedBook(by_machine={22: 6.0})  # the field report's slow host: 6 s instead of 4
    ranked = rank_offers([slow, normal], FIELD_REPORT_REQ, FIELD_REPORT_JOB, book)
    assert [r.offer.id for r in ranked] == [1, 2]
    assert ranked[1].cost.train_h == pytest.approx(300 * 6.0 / 3600)
    assert ranked[1].cost.speed_source == "machine"


# --- the cost model --------------------------------------------------------------------------


def test_the_image_pull_costs_storage_and_traffic_but_no_gpu_time():
    job = JobProfile(image_gb=5, model_gb=10, upload_gb=2, steps_total=100, container_start_s=90)
    cost = estimate_cost(make_offer(), job, REFERENCE, Requirements(rental=ON_DEMAND, disk_gb=40))
    image_h, model_h = 5 * GIB * 8 / 1e9 / 3600, 10 * GIB * 8 / 1e9 / 3600  # at 1000 Mbit/s
    train_h, start_h = 100 * 4.0 / 3600, 90 / 3600
    assert cost.image_pull_h == pytest.approx(image_h)
    assert cost.startup_h == pytest.approx(image_h + model_h + start_h)
    assert cost.gpu_billed_h == pytest.approx(model_h + start_h + train_h)
    assert cost.storage_billed_h == pytest.approx(image_h + model_h + start_h + train_h)
    assert cost.gpu_usd == pytest.approx(0.36 * (model_h + start_h + train_h))
    assert cost.storage_usd == pytest.approx(0.144 / 720 * 40 * cost.storage_billed_h)
    assert cost.download_usd == pytest.approx(15 * 2 / 1024)
    assert cost.upload_usd == pytest.approx(2 * 3 / 1024)
    parts = cost.gpu_usd + cost.storage_usd + cost.download_usd + cost.upload_usd
    assert cost.total_usd == pytest.approx(parts)


def test_resuming_shortens_training_and_fetches_the_checkpoint_first():
    fresh = replace(FIELD_REPORT_JOB, checkpoint_gb=0.5)
    resumed = replace(fresh, steps_done=100)  # the field report resumed from checkpoint 100
    cost_fresh = estimate_cost(make_offer(), fresh, REFERENCE, FIELD_REPORT_REQ)
    cost_resumed = estimate_cost(make_offer(), resumed, REFERENCE, FIELD_REPORT_REQ)
    assert cost_fresh.train_h == pytest.approx(300 * 4.0 / 3600)
    assert cost_resumed.train_h == pytest.approx(200 * 4.0 / 3600)
    assert cost_resumed.steps_remaining == 200
    assert cost_resumed.download_gb == cost_fresh.download_gb + 0.5
    assert cost_resumed.upload_gb == pytest.approx(1 * 200 / 300)
    assert cost_resumed.total_usd < cost_fresh.total_usd


def test_a_finished_job_costs_only_its_start_up():
    done = replace(FIELD_REPORT_JOB, steps_done=300)
    cost = estimate_cost(make_offer(), done, REFERENCE, FIELD_REPORT_REQ)
    assert cost.train_h == 0
    assert cost.upload_usd == 0


def test_transfer_time_uses_decimal_megabits_and_binary_gigabytes():
    assert transfer_hours(1, 8 * GIB / 1e6 / 3600) == pytest.approx(1.0)


def test_a_cost_breakdown_is_plain_json():
    cost = estimate_cost(make_offer(), FIELD_REPORT_JOB, REFERENCE, FIELD_REPORT_REQ)
    data = json.loads(json.dumps(cost.as_dict()))
    assert data["total_usd"] == cost.total_usd
    assert data["speed_source"] == "dlperf"
    assert math.isclose(cost.wall_h, cost.startup_h + cost.train_h)


# --- ranking and the decision ----------------------------------------------------------------


def test_a_cheaper_gpu_with_costly_traffic_ranks_below_a_dearer_one_with_free_traffic():
    metered = make_offer(id=1, machine_id=1, dph_base=0.29, inet_down_cost=45 / 1024)
    free = make_offer(id=2, machine_id=2, dph_base=0.37, inet_down_cost=0.0)
    ranked = rank_offers([metered, free], FIELD_REPORT_REQ, FIELD_REPORT_JOB)
    assert [r.offer.id for r in ranked] == [2, 1]


def test_equal_cost_goes_to_the_more_reliable_host_then_the_lower_id():
    offers = [
        make_offer(id=3, machine_id=3, reliability=0.99),
        make_offer(id=2, machine_id=2, reliability=0.995),
        make_offer(id=1, machine_id=1, reliability=0.99),
    ]
    ranked = rank_offers(offers, FIELD_REPORT_REQ, FIELD_REPORT_JOB, REFERENCE)
    assert [r.offer.id for r in ranked] == [2, 1, 3]


def test_the_decision_records_the_choice_runners_up_and_rejections_as_json():
    offers = [make_offer(id=i, machine_id=i, dph_base=0.30 + i / 100) for i in range(1, 8)]
    offers += [make_offer(id=90, reliability=0.5), make_offer(id=91, gpu_name="RTX 3090")]
    decision = choose_offer(offers, FIELD_REPORT_REQ, FIELD_REPORT_JOB, top_n=3)
    data = json.loads(json.dumps(decision.as_dict()))
    assert data["chosen_offer_id"] == decision.chosen_offer_id == 1
    assert [c["offer"]["id"] for c in data["candidates"]] == [1, 2, 3]
    # The ranking's number: the run's cost plus the expected rework of a lost host.
    assert data["estimated_total_usd"] == data["chosen"]["rental"]["expected_total_usd"]
    assert data["chosen"]["cost"]["total_usd"] < data["estimated_total_usd"]
    assert data["rental"]["rental"]["kind"] == "on-demand"
    assert (data["offers_seen"], data["offers_ranked"], data["offers_rejected"]) == (9, 7, 2)
    assert data["rejected_by_rule"] == {"gpu_name": 1, "reliability": 1}
    assert data["requirements"]["gpu_names"] == ["RTX 4090"]
    assert data["profile"]["steps_total"] == 300


def test_no_decision_when_no_offer_qualifies():
    assert (
        choose_offer(
            [make_offer(reliability=0.5)], Requirements(rental=ON_DEMAND), FIELD_REPORT_JOB
        )
        is None
    )
    assert choose_offer([], Requirements(rental=ON_DEMAND), FIELD_REPORT_JOB) is None


# --- the field report on the shipped market ------------------------------------------------------


def readme_cost(raw: dict, hours: float = 0.44) -> float:
    """The market README's field-report price: GPU and 50 GB disk for 0.44 h, 15 GB down, 1 up."""
    storage = raw["storage_cost"] * 50 * hours / 720
    return raw["dph_base"] * hours + storage + 15 * raw["inet_down_cost"] + raw["inet_up_cost"]


def test_the_field_reports_job_avoids_the_traffic_trap_and_costs_what_the_report_says():
    offers, raw = load_market()
    decision = choose_offer(offers, FIELD_REPORT_REQ, FIELD_REPORT_JOB)
    kept, _ = filter_offers(offers, FIELD_REPORT_REQ)
    trap = min(kept, key=lambda o: o.dph_base)
    readme_pick = min(kept, key=lambda o: readme_cost(raw[o.id]))
    # The README's own figures, recomputed from the file: the trap $0.84, the full-cost pick $0.17.
    assert (trap.id, round(readme_cost(raw[trap.id]), 2)) == (TRAP_OFFER_ID, 0.84)
    assert round(readme_cost(raw[readme_pick.id]), 2) == 0.17
    assert len(kept) == 16  # "16 single RTX 4090 offers qualify"

    assert decision.chosen_offer_id != TRAP_OFFER_ID
    assert decision.chosen_offer_id == readme_pick.id
    # The README bills 0.44 h of wall time; we bill 300 steps (~0.33 h) plus the model download
    # at this host's link and the 60 s start (~2 min here), i.e. 0.35-0.42 h: 80-95 % of its
    # figure, within 25 % once the ±5 % DLPerf spread on s/step is added.
    chosen = decision.chosen.cost
    assert chosen.total_usd == pytest.approx(readme_cost(raw[readme_pick.id]), rel=0.25)
    assert 0.33 < chosen.gpu_billed_h < 0.44
    # The trap's cost is almost all traffic (15 GB at $45/TB = $0.66), which the hours do not
    # touch: our estimate lands within 10 % of the README's, and at least 4x the chosen total.
    ranked = rank_offers(offers, FIELD_REPORT_REQ, FIELD_REPORT_JOB)
    trap_cost = {r.offer.id: r.cost for r in ranked}[TRAP_OFFER_ID]
    assert trap_cost.total_usd == pytest.approx(readme_cost(raw[TRAP_OFFER_ID]), rel=0.10)
    assert trap_cost.total_usd > 4 * chosen.total_usd


def test_the_shipped_market_decision_fits_in_a_json_column():
    offers, _ = load_market()
    decision = choose_offer(offers, FIELD_REPORT_REQ, FIELD_REPORT_JOB)
    data = json.loads(json.dumps(decision.as_dict()))
    assert data["offers_seen"] == len(offers)
    assert data["offers_ranked"] + data["offers_rejected"] == len(offers)
    assert len(data["candidates"]) == selection.DEFAULT_TOP_N
