"""The offers preview tells the truth, on the shipped market through the sandbox over HTTP:
its headline is the total of the row it would rent, every row is priced the way it would be
rented (on-demand, or the bid), its columns multiply out and add up, and the job page's offers
and rental tables print one price at one precision."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from hosts import selection
from hosts.vast import VastClient
from jobs.job_templates import template_spec
from jobs.renting.terms import profile_from_spec, requirements_from_spec
from jobs.spec import JobSpec
from nomadgpu.humanize import money
from portal import figures
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}
RENTALS = (selection.ON_DEMAND, selection.INTERRUPTIBLE, selection.AUTO)


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


@pytest.fixture
def on_the_sandbox(sandbox, settings):
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = DEFAULT_KEY
    return sandbox


def toy_spec(rental: str) -> JobSpec:
    raw = template_spec("toy")
    raw.setdefault("requirements", {})["rental"] = rental
    return JobSpec.model_validate(raw)


def toy_form(rental: str) -> dict:
    data = {**spec_to_initial(template_spec("toy")), "team": "team-a", "rental": rental}
    return {**data, "verified_only": "on", "action": "preview"}


def ranking_of(spec: JobSpec, sandbox) -> dict:
    """What the selection decides for SPEC on the sandbox's market, asked independently."""
    req = requirements_from_spec(spec.requirements)
    profile = profile_from_spec(spec.profile, steps_total=spec.total_steps or 0)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        offers = client.search_offers(
            selection.vast_query(req), limit=selection.SEARCH_LIMIT, allocated_storage=req.disk_gb
        )
    # A team with no rentals yet: the memory of machines prices every start on its prior.
    memory = selection.NO_MEMORY
    return selection.choose_offer(
        offers, req, profile, top_n=figures.PREVIEW_TOP_N, memory=memory
    ).as_dict()


def estimate_text(html: str) -> str:
    return re.search(r'id="estimate">([^<]+)<', html).group(1)


@pytest.mark.parametrize("rental", RENTALS)
def test_the_headline_is_the_total_of_the_row_it_would_rent(member_client, on_the_sandbox, rental):
    response = member_client.post(reverse("job-new"), toy_form(rental), **HX)

    preview = response.context["preview"]
    chosen = preview.rows[0]
    decision = ranking_of(toy_spec(rental), on_the_sandbox)
    assert preview.estimated_total_usd == chosen.total_usd
    assert chosen.total_usd == pytest.approx(decision["estimated_total_usd"])
    assert estimate_text(response.content.decode()) == money(chosen.total_usd)


@pytest.mark.parametrize("rental", RENTALS)
def test_every_row_is_priced_as_it_would_be_rented_and_multiplies_out(
    member_client, on_the_sandbox, rental
):
    response = member_client.post(reverse("job-new"), toy_form(rental), **HX)

    rows = response.context["preview"].rows
    ranked = ranking_of(toy_spec(rental), on_the_sandbox)["candidates"]
    assert len(rows) == len(ranked) > 1
    for row, candidate in zip(rows, ranked, strict=True):
        way, cost = candidate["rental"], candidate["cost"]
        assert row.rental == way["rental"]["label"]
        assert row.usd_per_hour == way["gpu_usd_per_hour"]
        assert row.gpu_usd == pytest.approx(row.usd_per_hour * row.train_h)
        assert row.gpu_usd + row.startup_usd == pytest.approx(cost["gpu_usd"])
        columns = (row.gpu_usd, row.startup_usd, row.storage_usd, row.download_usd)
        rest = row.upload_usd + row.start_risk_usd + row.interruptions_usd
        assert row.total_usd == pytest.approx(sum(columns) + rest)
        assert row.total_usd == pytest.approx(way["expected_total_usd"])
        assert row.start_risk_usd == pytest.approx(way["start_risk_usd"])
        assert row.start_risk_usd > 0


def test_an_interruptible_preview_shows_the_bid_not_the_on_demand_price(
    member_client, on_the_sandbox
):
    response = member_client.post(reverse("job-new"), toy_form(selection.INTERRUPTIBLE), **HX)

    html = response.content.decode()
    ranked = ranking_of(toy_spec(selection.INTERRUPTIBLE), on_the_sandbox)["candidates"]
    for row, candidate in zip(response.context["preview"].rows, ranked, strict=True):
        assert row.rental.startswith("interruptible")
        assert row.usd_per_hour < candidate["offer"]["dph_base"]
        assert f'<td class="num">{money(row.usd_per_hour, per_hour=True)}</td>' in html
    chosen = response.context["preview"].rows[0]
    assert f"at {money(chosen.usd_per_hour, per_hour=True)}" in html


def test_the_rendered_row_prints_each_column_by_the_money_rule(member_client, on_the_sandbox):
    response = member_client.post(reverse("job-new"), toy_form(selection.AUTO), **HX)

    html = response.content.decode()
    row = response.context["preview"].rows[0]
    head = re.search(r'<table class="offers">.*?<thead>(.*?)</thead>', html, re.S).group(1)
    names = re.findall(r"<th[^>]*>(.*?)</th>", head, re.S)
    chosen = re.search(r'<tr class="chosen">(.*?)</tr>', html, re.S).group(1)
    cells = dict(zip(names, re.findall(r"<td[^>]*>(.*?)</td>", chosen, re.S), strict=True))
    amounts = {
        "GPU $": row.gpu_usd,
        "Start-up $": row.startup_usd,
        "Storage $": row.storage_usd,
        "Download $": row.download_usd,
        "Upload $": row.upload_usd,
        "Failed start $": row.start_risk_usd,
        "Interruptions $": row.interruptions_usd,
    }
    assert cells["$/h"] == money(row.usd_per_hour, per_hour=True)
    assert {name: cells[name] for name in amounts} == {k: money(v) for k, v in amounts.items()}
    assert re.sub(r"</?strong>", "", cells["Total $"]) == money(row.total_usd)


def test_the_job_pages_offers_and_rental_tables_print_one_price_at_one_precision(
    client, cast, on_the_sandbox
):
    decision = ranking_of(toy_spec(selection.INTERRUPTIBLE), on_the_sandbox)
    job = JobFactory(team=cast.team_a, total_steps=300)
    bid = decision["rental"]["gpu_usd_per_hour"]
    make_attempt(job, state="running", gpu_name="RTX 4090", dph_base=bid, decision=decision)
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[job.id])).content.decode()

    price = money(bid, per_hour=True)
    rental_line = re.search(r'id="rental-decision">(.*?)</p>', html, re.S).group(1)
    chosen = re.search(r'<tr class="chosen">(.*?)</tr>', html, re.S).group(1)
    assert f"at {price}" in rental_line
    assert f'<td class="num">{price}</td>' in chosen
    assert f"{bid:.4f}" not in html  # no second precision of the same price
