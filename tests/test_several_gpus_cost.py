"""Several GPUs of one host, in money (issue 31, item 4): an offer's prices are for the whole
instance, all its GPUs, and pages say the per-GPU price beside them; the s/step learned on
earlier runs is per GPU count (another count's is scaled, and says so); the expected cost
follows; and a GPU count no offer has is refused at submit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts import selection
from hosts.vast import Offer, VastClient
from jobs.job_templates import template_spec
from jobs.models import Job
from jobs.renting import corrections, measures, reference, shape_history, terms
from jobs.spec import JobSpec
from nomadgpu import api_tokens
from nomadgpu.humanize import instance_price
from portal import figures
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, make_attempt
from tests.support.market import load_market
from tests.support.sandbox import market_offers

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 4, 12, 0, tzinfo=UTC)
TOY_ENV = {"TOY_STEPS": "300", "TOY_STEP_SECONDS": "0.2"}
TYPED = {"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01}  # reference: 4 s on an RTX 4090


def rtx_4090(gpus: int) -> dict:
    return {"gpu_names": ["RTX 4090"], "num_gpus": gpus, "disk_gb": 20, "rental": "on-demand"}


def toy(team, gpus: int, **fields) -> Job:
    """A job of the toy's shape in TEAM on GPUS RTX 4090s of one host."""
    defaults = {"name": "toy", "env": dict(TOY_ENV), "total_steps": 300, "profile": dict(TYPED)}
    return JobFactory(team=team, requirements=rtx_4090(gpus), **{**defaults, **fields})


def ran(job: Job, *, gpus: int, spp: float, number: int = 1, dph: float = 0.4):
    """JOB's attempt NUMBER trained at SPP s/step on an offer of GPUS RTX 4090s at DPH $/h."""
    offer = {"id": 100 + number, "machine_id": 500 + number, "gpu_name": "RTX 4090",
             "num_gpus": gpus, "dlperf": 100.0 * gpus, "dph_base": dph}  # fmt: skip
    make_attempt(
        job, number=number, state="ended", machine_id=500 + number, gpu_name="RTX 4090",
        dph_base=dph, storage_usd_per_gb_hour=0.0002, download_usd_per_gb=0.0,
        upload_usd_per_gb=0.0, seconds_per_step=spp, step=300, exit_code=0, rented_at=T0,
        ended_at=T0 + timedelta(hours=1), decision={"chosen": {"offer": offer}},
    )  # fmt: skip


# --- $/h: the instance's, with the per-GPU price beside it ---------------------------------


def test_an_instance_price_reads_whole_with_its_per_gpu_price_beside_it():
    assert instance_price(1.6, 4) == "$1.60/h (4 \u00d7 $0.400)"
    assert instance_price(0.369, 1) == "$0.369/h"
    assert instance_price(0.9188, 2) == "$0.919/h (2 \u00d7 $0.459)"


def test_the_sandbox_prices_a_4_gpu_offer_whole_as_vast_does(sandbox):
    """Vast: a slice of a machine is offered at the host's per-GPU price times its count, and
    ``dph_total`` adds the instance's storage (hosts/vast/parsing/prices.py has the sources). The
    sandbox serves the market file's whole-instance prices untouched, at any query."""
    with VastClient("sandbox-key", sandbox.url) as vast:
        offers = vast.search_offers(
            {"num_gpus": {"eq": 4}, "gpu_name": {"eq": "RTX 4090"}}, limit=50, allocated_storage=20
        )
    market = market_offers()

    assert offers
    assert all(o.num_gpus == 4 for o in offers)
    for offer in offers:
        assert offer.dph_base == market[offer.id]["dph_base"]
        storage = offer.storage_usd_per_gb_hour * 20
        assert offer.dph_total == pytest.approx(offer.dph_base + storage, abs=1e-4)
        assert selection.job_dph_total(offer, 20) == pytest.approx(offer.dph_total, abs=1e-4)


def four_gpu_decision() -> dict:
    offers, _ = load_market()
    req = selection.Requirements(
        rental=selection.ON_DEMAND, gpu_names=("RTX 4090",), num_gpus=4, min_reliability=0.9,
        min_inet_down_mbps=100, disk_gb=20,
    )  # fmt: skip
    profile = selection.JobProfile(image_gb=3, model_gb=0, upload_gb=0.01, steps_total=300)
    decision = selection.choose_offer(offers, req, profile)
    assert decision is not None
    return decision.as_dict()


def test_the_offers_table_prices_the_whole_instance_and_says_the_price_per_gpu():
    decision = four_gpu_decision()
    chosen = decision["chosen"]["offer"]

    row = figures.offer_rows(decision)[0]

    assert chosen["num_gpus"] == 4
    # The GPU dollars are the offer's own dph_base (all four GPUs) times the hours: not x 4.
    assert row.usd_per_hour == chosen["dph_base"]
    assert decision["chosen"]["cost"]["gpu_usd"] == pytest.approx(
        chosen["dph_base"] * decision["chosen"]["cost"]["gpu_billed_h"]
    )
    assert row.texts["usd_per_hour"] == instance_price(chosen["dph_base"], 4)
    assert " (4 \u00d7 $" in row.texts["usd_per_hour"]


def test_the_job_page_says_the_rented_price_for_all_gpus_and_per_gpu(client, cast):
    client.force_login(cast.member)
    job = toy(cast.team_a, 4, state="running")
    decision = four_gpu_decision()
    price = decision["rental"]["gpu_usd_per_hour"]
    make_attempt(
        job, state="running", instance_id=41, gpu_name="RTX 4090", dph_base=price,
        decision=decision,
    )  # fmt: skip

    html = client.get(reverse("job-detail", args=[job.pk])).content.decode()

    assert f"at {instance_price(price, 4)}:" in html
    assert f"RTX 4090 ({instance_price(price, 4)}" in html


# --- s/step: per GPU count ------------------------------------------------------------------


def test_a_speed_measured_on_one_gpu_is_not_taken_as_measured_on_four(cast):
    job = toy(cast.team_a, 1)
    ran(job, gpus=1, spp=2.0)
    job.requirements = rtx_4090(4)  # the same job, edited to four GPUs: a new shape
    job.save()

    history = shape_history.history_for(job)
    profile = terms.profile_for(job, history)
    line = corrections.figure_lines(terms.typed_profile_for(job), history)[0]

    four = 2.0 / selection.MULTI_GPU_EFFICIENCY**2
    assert profile.reference_seconds_per_step == pytest.approx(four)
    assert history.speeds.estimated_from == (1,)
    assert line.source == "estimated from 1-GPU runs, 1 run"


def test_a_new_job_at_another_count_is_estimated_from_the_shape_s_runs_at_others(cast):
    ran(toy(cast.team_a, 2), gpus=2, spp=3.0)
    ran(toy(cast.team_b, 1), gpus=1, spp=0.5)  # another team's run never counts
    job = toy(cast.team_a, 4)

    profile = terms.profile_for(job)

    assert profile.reference_seconds_per_step == pytest.approx(3.0 / 0.95)


def test_a_speed_measured_at_the_job_s_own_count_wins_over_other_counts(cast):
    ran(toy(cast.team_a, 1), gpus=1, spp=2.0)
    ran(toy(cast.team_a, 4), gpus=4, spp=2.5)
    job = toy(cast.team_a, 4)

    history = shape_history.history_for(job)

    assert terms.profile_for(job, history).reference_seconds_per_step == 2.5
    assert history.speeds.estimated_from == ()
    assert corrections.figure_lines(terms.typed_profile_for(job), history)[0].source == (
        "measured on 1 run"
    )


def test_seconds_per_step_scale_by_the_documented_efficiency_both_ways():
    assert selection.seconds_per_step_at(2.0, measured_gpus=1, num_gpus=4) == pytest.approx(
        2.0 / 0.95**2
    )
    assert selection.seconds_per_step_at(2.0, measured_gpus=4, num_gpus=1) == pytest.approx(
        2.0 * 0.95**2
    )
    assert selection.seconds_per_step_at(2.0, measured_gpus=2, num_gpus=2) == 2.0


def test_the_counts_a_speed_was_estimated_from_read_as_words():
    assert measures.Speeds(estimated_from=(1,)).source_words == "estimated from 1-GPU runs"
    assert measures.Speeds(estimated_from=(1, 2, 8)).source_words == (
        "estimated from 1-, 2- and 8-GPU runs"
    )
    assert measures.Speeds().source_words == ""


def test_the_host_a_job_paid_is_per_gpu_count_too(cast):
    job = toy(cast.team_a, 1)
    ran(job, gpus=1, spp=2.0, dph=0.4)
    job.requirements = rtx_4090(4)
    job.save()

    # A one-GPU instance's $0.40/h is not what four GPUs cost: the typed 4 x $0.40 stands.
    assert shape_history.history_for(job).host is None


# --- The expected cost, 2 and 4 GPUs --------------------------------------------------------


def test_the_pre_flight_estimate_scales_with_the_gpus_and_the_learned_speed(cast, settings):
    settings.BUDGET_ESTIMATE_DPH = 0.4
    ran(toy(cast.team_a, 2), gpus=2, spp=3.0, dph=0.8)  # a 2-GPU instance at $0.80/h
    two, four = toy(cast.team_a, 2), toy(cast.team_a, 4)

    cost_two, cost_four = reference.estimate_for(two), reference.estimate_for(four)

    # Two GPUs: the 2-GPU run's 3 s/step at the $0.80/h it paid; four: 3 / 0.95 s at the
    # typed 4 x $0.40 (a 2-GPU instance's price says nothing of a 4-GPU one's).
    assert cost_two.seconds_per_step == 3.0
    assert cost_four.seconds_per_step == pytest.approx(3.0 / 0.95)
    assert cost_two.train_h == pytest.approx(300 * 3.0 / 3600)
    per_hour_two = cost_two.gpu_usd / cost_two.gpu_billed_h
    per_hour_four = cost_four.gpu_usd / cost_four.gpu_billed_h
    assert (per_hour_two, per_hour_four) == (pytest.approx(0.8), pytest.approx(1.6))


def test_on_the_sandbox_market_the_expected_cost_of_4_gpus_is_priced_on_4_gpu_offers():
    offers, _ = load_market()
    profile = selection.JobProfile(
        image_gb=3, model_gb=0, upload_gb=0.01, steps_total=3000, reference_seconds_per_step=2
    )
    chosen = {}
    for gpus in (2, 4):
        req = selection.Requirements(
            rental=selection.ON_DEMAND, gpu_names=("RTX 4090",), num_gpus=gpus,
            min_reliability=0.9, min_inet_down_mbps=100, disk_gb=20,
        )  # fmt: skip
        decision = selection.choose_offer(offers, req, profile)
        assert decision is not None
        chosen[gpus] = decision.chosen
    for gpus, ranked in chosen.items():
        assert ranked.offer.num_gpus == gpus
        assert ranked.cost.gpu_usd == pytest.approx(
            ranked.offer.dph_base * ranked.cost.gpu_billed_h
        )
    # The market's 4-GPU hosts cost more an hour than its 2-GPU ones; at the same typed speed
    # (measured on the job's own count) the 4-GPU job costs more.
    assert chosen[4].offer.dph_base > chosen[2].offer.dph_base
    assert chosen[4].expected_total_usd > chosen[2].expected_total_usd


# --- Submit: a count no offer has -----------------------------------------------------------


def submit(client, user, **requirements):
    spec = template_spec("toy")
    spec["requirements"] = {**spec.get("requirements", {}), **requirements}
    _, token = api_tokens.create_token(user=user, name="t", now=timezone.now())
    return client.post(
        "/api/jobs/", {**spec, "team": "team-a"}, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip


def most_gpus(offers: list[Offer], name: str) -> int:
    return max(o.num_gpus for o in offers if o.gpu_name == name and o.verified)


def test_more_gpus_than_any_offer_has_is_refused_at_submit_naming_the_most(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    most = most_gpus(load_market()[0], "RTX 4090")

    response = submit(client, cast.member, gpu_names=["RTX 4090"], num_gpus=16)

    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"][-2:] == ["requirements", "num_gpus"]
    assert detail["msg"] == (
        f"no offer has 16 GPUs of RTX 4090 on one host; the most is {most}: "
        "lower requirements.num_gpus"
    )
    assert Job.objects.count() == 0


def test_a_count_some_offer_has_is_accepted(client, cast, sandbox, settings):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"

    response = submit(client, cast.member, gpu_names=["RTX 4090"], num_gpus=4)

    assert response.status_code == 201, response.content


def test_an_unreachable_market_does_not_fail_the_submit(client, cast, settings):
    settings.VAST_URL, settings.VAST_API_KEY = "http://127.0.0.1:9", "key"  # nothing listens

    response = submit(client, cast.member, gpu_names=["RTX 4090"], num_gpus=16)

    assert response.status_code == 201, response.content
    assert Job.objects.get().requirements["num_gpus"] == 16


def test_the_portal_form_says_it_under_the_gpu_count(client, cast, sandbox, settings):
    client.force_login(cast.member)
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    form = {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"}
    form |= {"gpu_names": "RTX 4090", "num_gpus": "16"}

    response = client.post(reverse("job-new"), form)

    assert response.status_code == 200
    assert "no offer has 16 GPUs of RTX 4090 on one host" in response.content.decode()
    assert Job.objects.count() == 0


def test_one_gpu_asks_the_market_nothing(cast):
    class NoMarket:
        def search_offers(self, *args, **kwargs):
            raise AssertionError("searched")

    spec = JobSpec.model_validate(template_spec("toy"))

    assert figures.gpu_count_blocker(spec, team=cast.team_a, client=NoMarket()) is None


def test_the_preview_of_four_gpus_after_a_one_gpu_run_says_its_speed_is_estimated(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    spec = JobSpec(**template_spec("toy"))
    first = JobFactory(team=cast.team_a, state="succeeded", **spec.job_fields())
    ran(first, gpus=1, spp=0.2)
    client.force_login(cast.member)
    form = {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"}
    form |= {"gpu_names": "RTX 4090", "num_gpus": "4", "action": "preview"}

    reply = client.post(reverse("job-new"), form, HTTP_HX_REQUEST="true")

    lines = {line.figure: line for line in reply.context["estimate_figures"]}
    assert lines["Seconds per step"].source == "estimated from 1-GPU runs, 1 run"
    assert "(estimated from 1-GPU runs, 1 run)" in reply.content.decode()
    chosen = reply.context["preview"].chosen
    assert chosen.num_gpus == 4
    assert chosen.train_h == pytest.approx(300 * 0.2 / 0.95**2 / 3600)
    assert " (4 \u00d7 $" in chosen.texts["usd_per_hour"]
