"""A job in the market's terms (jobs/renting/terms.py): defaults come from JobSpec alone, stored
JSON that no longer fits names its field, and the stored rent decision is read in one place."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.utils import timezone

from billing import services
from hosts import selection
from hosts.vast import VastClient, parse_offer
from jobs import lifecycle, rent_decision, stored_spec
from jobs.models import Attempt
from jobs.rent_decision import RentDecision
from jobs.renting import corrections, reference, rent, shape_history, terms
from jobs.spec import JobSpec, ProfileSpec, RequirementsSpec
from jobs.stored_spec import StoredSpecInvalid
from tests.support.factories import JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY, market_offers

pytestmark = pytest.mark.django_db

RTX_4090 = {"gpu_names": ["RTX 4090"], "disk_gb": 20}


def market() -> list:
    return [parse_offer(o) for o in market_offers().values()]


# --- One place for the defaults ----------------------------------------------------------------


def test_a_job_that_leaves_everything_out_gets_jobspecs_defaults():
    job = JobFactory(requirements={}, profile={}, total_steps=300)
    spec = JobSpec(name="j", image="img", command="c")

    req, profile = terms.requirements_for(job), terms.profile_for(job)

    assert req == terms.requirements_from_spec(spec.requirements)
    assert req.rental == spec.requirements.rental == selection.AUTO
    assert profile == terms.profile_from_spec(spec.profile, steps_total=300)
    assert (profile.image_gb, profile.upload_gb) == (spec.profile.image_gb, spec.profile.upload_gb)


def test_the_selection_carries_no_rental_of_its_own():
    with pytest.raises(TypeError, match="rental"):
        selection.Requirements()  # type: ignore[call-arg]


def test_a_job_with_no_rental_weighs_bids_where_on_demand_would_not():
    job = JobFactory(requirements=RTX_4090, total_steps=300)
    req, profile = terms.requirements_for(job), terms.profile_for(job)

    auto = selection.choose_offer(market(), req, profile)
    on_demand = selection.choose_offer(market(), replace(req, rental=selection.ON_DEMAND), profile)

    assert auto.chosen.rental.rental.kind == selection.INTERRUPTIBLE
    assert on_demand.chosen.rental.rental.kind == selection.ON_DEMAND


def test_a_job_with_no_rental_is_rented_auto_by_the_rent_and_priced_the_same_by_billing(
    sandbox, settings, monkeypatch
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)  # no worker here
    job = JobFactory(requirements=RTX_4090, total_steps=300)
    now = timezone.now()

    attempt = lifecycle.plan_rent(job.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        assert rent.rent(attempt.pk, now=now, client=client) == "rented"
    attempt.refresh_from_db()

    assert attempt.decision["requirements"]["rental"] == RequirementsSpec().rental == "auto"
    assert attempt.rental == selection.INTERRUPTIBLE  # a bid is cheaper on this market
    # The rent it got is now the job's own history: the estimate prices the rate it paid.
    history = shape_history.history_for(job)
    assert history.host.dph == attempt.dph_base
    expected = reference.reference_cost(
        terms.requirements_from_spec(RequirementsSpec(**RTX_4090)),
        corrections.corrected_profile(
            terms.profile_from_spec(ProfileSpec(), steps_total=300), history
        ),
        history,
    )
    assert services.estimate_remaining_usd(job) == pytest.approx(expected.total_usd)


# --- Stored JSON that no longer fits -------------------------------------------------------------


def test_a_typo_in_the_stored_requirements_names_the_key_not_a_type_error():
    job = JobFactory(requirements={"gpu_name": ["RTX 4090"]})

    with pytest.raises(StoredSpecInvalid) as caught:
        terms.requirements_for(job)

    assert not isinstance(caught.value, TypeError)
    assert str(caught.value) == "requirements: unknown key 'gpu_name' (did you mean 'gpu_names'?)"
    assert caught.value.fields == ("requirements.gpu_name",)
    assert caught.value.job_id == job.pk


def test_a_typo_in_the_stored_profile_stops_its_translation_too():
    job = JobFactory(profile={"image_gbs": 3})

    with pytest.raises(
        StoredSpecInvalid, match=r"^profile: unknown key 'image_gbs' \(did you mean"
    ):
        terms.profile_for(job)


def test_a_stored_value_out_of_range_says_which_and_what_was_found():
    job = JobFactory(requirements={"num_gpus": 0})

    with pytest.raises(StoredSpecInvalid) as caught:
        terms.requirements_for(job)

    assert str(caught.value) == (
        "requirements: bad value for 'num_gpus': input should be greater than or equal to 1 "
        "(found 0)"
    )


def test_every_stored_part_is_checked_at_once_with_the_schema_of_every_way_in():
    job = JobFactory(
        requirements={"min_reliabilty": 0.5}, profile=["not", "an", "object"], env={"1BAD": "x"}
    )

    with pytest.raises(StoredSpecInvalid) as caught:
        stored_spec.validate_stored(job)

    assert caught.value.fields == ("requirements.min_reliabilty", "profile", "env")
    said = str(caught.value)
    assert "requirements: unknown key 'min_reliabilty' (did you mean 'min_reliability'?)" in said
    assert "profile: should be an object of keys and values, not a list" in said
    assert "env: '1BAD' is not a valid variable name" in said


def test_a_stored_spec_that_fits_reads_with_the_defaults_filled_in():
    job = JobFactory(requirements=RTX_4090, profile={"model_gb": 15}, env={"HF_HOME": "/hf"})

    stored = stored_spec.validate_stored(job)

    assert stored.requirements == RequirementsSpec(**RTX_4090)
    assert stored.profile.model_gb == 15
    assert stored.profile.image_gb == ProfileSpec().image_gb
    assert stored.env == {"HF_HOME": "/hf"}


# --- The stored rent decision ----------------------------------------------------------------


def test_the_stored_decision_reads_back_what_the_rent_priced():
    job = JobFactory(requirements=RTX_4090, profile={"image_gb": 3.0}, total_steps=300)
    req, profile = terms.requirements_for(job), terms.profile_for(job)
    decision = selection.choose_offer(market(), req, profile)
    attempt, _ = make_attempt(job, decision=decision.as_dict())

    read = RentDecision.of(attempt)

    assert read.image_gb == 3.0
    assert read.upload_mbps == decision.chosen.offer.inet_up_mbps
    assert read.seconds_per_step == decision.chosen.cost.seconds_per_step
    assert read.steps_planned == 300
    assert read.upload_usd == decision.chosen.cost.upload_usd


def test_an_adopted_or_older_attempt_reads_as_having_no_figures():
    for stored in ({"adopted": True}, {}, {"chosen": None}):
        read = RentDecision(stored)
        assert (read.image_gb, read.upload_mbps, read.seconds_per_step) == (0.0, None, None)
        assert (read.steps_planned, read.upload_usd) == (0, 0.0)


def test_the_page_shows_the_newest_attempt_that_recorded_a_decision():
    job = JobFactory()
    make_attempt(job, number=1, state="ended", decision={"chosen_offer_id": 1})
    make_attempt(job, number=2, state="ended", decision={"chosen_offer_id": 2})
    make_attempt(job, number=3, state="ended")

    shown = rent_decision.page_decision(Attempt.objects.filter(job=job).order_by("number"))

    assert shown == {"chosen_offer_id": 2}
