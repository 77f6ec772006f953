"""Estimates that learn (jobs/renting/): a second run of a job's shape is estimated from
what the first measured (s/step, the command's downloads, start-up, checkpoints, the host it
paid for); a shape never run keeps its typed profile; another team's runs never count."""

from __future__ import annotations

import importlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing import services
from billing.spend import job_spend
from hosts import selection
from hosts.vast import VastClient, parse_offer
from jobs import lifecycle, rent_decision
from jobs.job_templates import template_spec
from jobs.models import Job
from jobs.renting import corrections, reference, rent, shape_history, terms
from jobs.spec import JobSpec, ProfileSpec, RequirementsSpec
from jobs.spending import BudgetExceeded
from portal import figures
from portal.forms import spec_to_initial
from tests.support.factories import CheckpointFactory, JobFactory, make_attempt
from tests.support.sandbox import DEFAULT_KEY, market_offers

pytestmark = pytest.mark.django_db

GB = 1024**3
T0 = datetime(2026, 11, 4, 12, 0, tzinfo=UTC)
HEAVY_4090 = 17179682  # RTX 4090, $0.288/h, $0.044/GB each way
PLAIN_4090 = 16018470  # RTX 4090, $0.369/h, free traffic
TOY_ENV = {"TOY_STEPS": "300", "TOY_STEP_SECONDS": "0.2"}
RTX_4090 = {"gpu_names": ["RTX 4090"], "disk_gb": 20, "rental": "on-demand"}
LIMIT = Decimal("0.01")  # the job limit, refused at "$0.14"
TYPED = {"image_gb": 3.0, "model_gb": 0.0, "upload_gb": 0.01}  # the toy template's profile


def toy(team, **fields) -> Job:
    """A job of the toy's shape in TEAM (the same name, image, command and env)."""
    defaults = {
        "name": "toy",
        "env": dict(TOY_ENV),
        "total_steps": 300,
        "requirements": RTX_4090,
        "profile": dict(TYPED),
    }
    return JobFactory(team=team, **{**defaults, **fields})


def finished_run(
    team, *, spp=0.2, steps=300, start_s=8.0, pull_s=2.0, job_env=None, **attempt_fields
):
    """A toy job (with JOB_ENV, else the toy's) that trained STEPS at SPP s/step on one host and
    finished: container up PULL_S after the rent, and START_S of GPU time besides the steps."""
    job = toy(team, state="succeeded", total_steps=steps, env=dict(job_env or TOY_ENV))
    up = T0 + timedelta(seconds=pull_s)
    fields = {
        "machine_id": 16018,
        "gpu_name": "RTX 4090",
        "dph_base": 0.369,
        "storage_usd_per_gb_hour": 0.0002,
        "download_usd_per_gb": 0.0,  # the market's plain RTX 4090: free traffic
        "upload_usd_per_gb": 0.0,
        "disk_gb": 20,
        "seconds_per_step": spp,
        "step": steps,
        "exit_code": 0,
        "rented_at": T0,
        "container_started_at": up,
        "registered_at": up + timedelta(seconds=1),
        "first_step_at": up + timedelta(seconds=start_s / 2),
        "ended_at": up + timedelta(seconds=start_s + steps * spp),
        **attempt_fields,
    }
    attempt, _ = make_attempt(job, state="ended", **fields)
    return job, attempt


def typed_estimate(job: Job) -> selection.CostBreakdown:
    req = terms.requirements_for(job)
    return reference.reference_cost(req, terms.typed_profile_for(job))


# --- A shape never run ------------------------------------------------------------------------


def test_a_shape_never_run_is_estimated_from_its_typed_profile(cast):
    job = toy(cast.team_a)

    assert terms.profile_for(job) == terms.typed_profile_for(job)
    assert reference.estimate_for(job) == typed_estimate(job)
    # The figure: 300 typed steps of 4 s at $0.40/h on the reference host.
    assert services.estimate_remaining_usd(job) == pytest.approx(0.14, abs=0.005)
    assert all(not line.measured for line in portal_lines(job))


def portal_lines(job: Job) -> list[corrections.FigureLine]:
    return corrections.figure_lines(terms.typed_profile_for(job), shape_history.history_for(job))


# --- A second run of a shape ------------------------------------------------------------------


def test_a_second_run_takes_the_first_runs_seconds_per_step(cast):
    finished_run(cast.team_a, spp=0.2)
    second = toy(cast.team_a)

    profile = terms.profile_for(second)
    estimate = reference.estimate_for(second)

    assert profile.reference_seconds_per_step == pytest.approx(0.2)
    assert estimate.seconds_per_step == pytest.approx(0.2)
    assert estimate.train_h == pytest.approx(300 * 0.2 / 3600)
    assert estimate.speed_source == selection.SPEED_MODEL


def test_the_toys_second_run_fits_the_limit_its_typed_estimate_was_refused_at(cast):
    with pytest.raises(BudgetExceeded, match=r"estimated cost \$0.142 would cross"):
        lifecycle.submit_job(
            team=cast.team_a, created_by=cast.member, now=T0, **toy_fields(), budget_usd=LIMIT
        )
    finished_run(cast.team_a, spp=0.2)

    job = lifecycle.submit_job(
        team=cast.team_a, created_by=cast.member, now=T0, **toy_fields(), budget_usd=LIMIT
    )

    # 60 s of steps and 8 s of start at the $0.369/h the first run paid, free of the typed 4 s.
    assert services.estimate_remaining_usd(job) == pytest.approx(68 / 3600 * 0.369, rel=0.05)
    assert Job.objects.get(pk=job.pk).state == "queued"


def toy_fields() -> dict:
    return {
        "name": "toy",
        "image": JobFactory.image,
        "command": JobFactory.command,
        "env": dict(TOY_ENV),
        "total_steps": 300,
        "requirements": RTX_4090,
        "profile": dict(TYPED),
    }


def test_a_second_run_takes_the_bytes_the_first_runs_command_downloaded(cast):
    # 2.5 GiB came into the container, of which 0.5 GiB the agent fetched itself (a restore).
    finished_run(
        cast.team_a,
        net_rx_bytes=int(2.5 * GB),
        bytes_down=int(0.5 * GB),
        download_usd_per_gb=0.001,
    )
    second = toy(cast.team_a)

    profile = terms.profile_for(second)
    estimate = reference.estimate_for(second)

    assert profile.model_gb == pytest.approx(2.0)
    assert estimate.download_gb == pytest.approx(TYPED["image_gb"] + 2.0)
    # Priced at the $0.001/GB the first run's host charged, where the typed host was free.
    assert estimate.download_usd == pytest.approx((TYPED["image_gb"] + 2.0) * 0.001)


def test_a_run_whose_agent_reported_no_counters_teaches_no_download(cast):
    finished_run(cast.team_a, net_rx_bytes=0, bytes_down=0)

    assert terms.profile_for(toy(cast.team_a)).model_gb == TYPED["model_gb"]


def test_a_second_run_takes_the_first_runs_pull_and_start_up(cast):
    finished_run(cast.team_a, spp=0.5, steps=100, pull_s=40.0, start_s=80.0)
    second = toy(cast.team_a, total_steps=200)

    profile = terms.profile_for(second)
    estimate = reference.estimate_for(second)

    assert (profile.pull_s, profile.start_s) == (pytest.approx(40.0), pytest.approx(80.0))
    assert estimate.image_pull_h == pytest.approx(40 / 3600)
    assert estimate.container_start_h == pytest.approx(80 / 3600)
    assert estimate.model_download_h == 0  # the command's downloads are in the measured start
    assert estimate.gpu_billed_h == pytest.approx((80 + 200 * 0.5) / 3600)


def test_a_resumes_checkpoint_restore_is_not_counted_in_its_start_up(cast):
    _, attempt = finished_run(cast.team_a, spp=0.5, steps=100, start_s=80.0)
    # The last attempt resumed at step 40: 60 steps trained, and 30 s spent on the restore.
    up = attempt.container_started_at
    type(attempt).objects.filter(pk=attempt.pk).update(
        resumed_from_step=40,
        deps_ready_at=up + timedelta(seconds=5),
        restore_unpacked_at=up + timedelta(seconds=35),
        ended_at=up + timedelta(seconds=80 + 30 + 60 * 0.5),
    )

    assert terms.profile_for(toy(cast.team_a)).start_s == pytest.approx(80.0)


def test_a_host_lost_mid_run_teaches_no_start_up(cast):
    # Its end is the loss's detection, not a last upload and an exit.
    finished_run(cast.team_a, exit_code=None, end_reason="host_lost")

    profile = terms.profile_for(toy(cast.team_a))

    assert profile.start_s is None
    assert profile.container_start_s == ProfileSpec().container_start_s


def test_a_second_run_takes_the_first_runs_checkpoint_sizes_and_uploads(cast):
    _job, attempt = finished_run(cast.team_a, steps=100, upload_usd_per_gb=0.002)
    for step, upload_s in ((50, 2.0), (100, 4.0)):
        ready_at = T0 + timedelta(seconds=step)
        CheckpointFactory(
            attempt=attempt,
            step=step,
            state="pruned" if step == 50 else "ready",
            size=100 * 1024**2,
            created_at=ready_at - timedelta(seconds=upload_s),
            ready_at=ready_at,
        )
    second = toy(cast.team_a, total_steps=300)

    profile = terms.profile_for(second)
    history = shape_history.history_for(second)

    assert profile.checkpoint_gb == pytest.approx(100 / 1024)
    # 200 MB over 100 steps, for a run of 300.
    assert profile.upload_gb == pytest.approx(600 / 1024)
    assert history.checkpoints.upload_s == pytest.approx(3.0)
    assert reference.estimate_for(second).upload_usd == pytest.approx(600 / 1024 * 0.002)


def test_the_estimate_prices_the_host_the_shape_was_rented_on(cast):
    finished_run(cast.team_a, gpu_name="H100 SXM", dph_base=1.728, spp=0.1)

    estimate = reference.estimate_for(toy(cast.team_a))

    assert estimate.gpu_usd == pytest.approx(1.728 * estimate.gpu_billed_h)
    assert estimate.seconds_per_step == pytest.approx(0.1)


def test_the_estimate_prices_again_the_offers_the_last_rent_weighed_and_takes_the_cheapest(cast):
    # The first run was rented on the cheaper GPU of a link metered at $45/TB, ranked with the
    # typed 4 s/step. It trained at 0.2 s/step and its command pulled 5 GB: on the plain RTX
    # 4090 with free traffic the same run now costs a fraction of the metered host's.
    req = terms.requirements_from_spec(RequirementsSpec(**RTX_4090))
    candidates = [
        {"offer": selection.offer_summary(parse_offer(market_offers()[ask]), req)}
        for ask in (HEAVY_4090, PLAIN_4090)
    ]
    finished_run(
        cast.team_a,
        offer_id=HEAVY_4090,
        dph_base=0.288,
        download_usd_per_gb=0.0439,
        net_rx_bytes=5 * GB,
        decision={"chosen": candidates[0], "candidates": candidates},
    )

    estimate = reference.estimate_for(toy(cast.team_a))

    assert estimate.offer_id == PLAIN_4090
    assert estimate.download_usd == 0
    assert estimate.gpu_usd == pytest.approx(0.369174 * (8 + 300 * 0.2) / 3600)


def test_a_paused_jobs_projection_prices_its_rest_at_its_own_measured_speed(cast):
    job, attempt = finished_run(cast.team_a, spp=0.2, steps=150, exit_code=None)
    Job.objects.filter(pk=job.pk).update(state="paused_budget", total_steps=300)
    CheckpointFactory(attempt=attempt, step=150, state="ready", size=8192, ready_at=T0)
    job.refresh_from_db()
    now = T0 + timedelta(hours=1)

    rest = services.projected_total(job, now=now) - job_spend(job, now=now).total

    # A typed 60 s start and 150 steps left at 0.2 s, on the $0.369/h host it ran on (the
    # typed 4 s/step made the rest ten times that).
    assert rest == pytest.approx((60 + 150 * 0.2) / 3600 * 0.369, rel=0.05)


def test_speeds_on_another_gpu_model_are_scaled_to_the_reference_by_dlperf(cast):
    # An A100 of DLPerf 200 did 0.1 s; the reference RTX 4090 is DLPerf 100: 0.2 s there.
    decision = {"chosen": {"offer": {"gpu_name": "A100 SXM4", "dlperf": 200.0, "num_gpus": 1}}}
    finished_run(cast.team_a, gpu_name="A100 SXM4", spp=0.1, decision=decision)

    profile = terms.profile_for(toy(cast.team_a))

    assert profile.reference_seconds_per_step == pytest.approx(0.2)


def test_the_median_of_the_newest_runs_shrugs_off_one_odd_host(cast):
    for spp in (0.2, 0.21, 0.6):
        finished_run(cast.team_a, spp=spp, machine_id=None)

    assert terms.profile_for(toy(cast.team_a)).reference_seconds_per_step == 0.21


# --- What never counts ------------------------------------------------------------------------


def test_another_teams_runs_never_count(cast):
    finished_run(cast.team_b, spp=0.2, net_rx_bytes=3 * GB)
    mine = toy(cast.team_a)

    assert terms.profile_for(mine) == terms.typed_profile_for(mine)
    assert reference.estimate_for(mine) == typed_estimate(mine)


@pytest.mark.parametrize(
    "change",
    [
        {"command": "python b.py"},
        {"image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"},
        {"setup": "pip install x"},
    ],
    ids=["command", "image", "setup"],
)
def test_another_program_is_another_shape(cast, change):
    # (Another GPU count is the same job's shape at that count: tests/test_several_gpus_cost.py.)
    finished_run(cast.team_a, spp=0.2)
    other = toy(cast.team_a, **change)

    assert terms.profile_for(other) == terms.typed_profile_for(other)


def test_two_jobs_differing_only_in_name_and_env_share_a_shape(cast):
    finished_run(cast.team_a, spp=0.2)
    renamed = toy(cast.team_a, name="toy, second try", env={**TOY_ENV, "TOY_SEED": "7"})

    assert renamed.shape == toy(cast.team_a).shape
    assert terms.profile_for(renamed).reference_seconds_per_step == pytest.approx(0.2)


def test_a_changed_env_is_followed_by_the_median_of_the_newest_runs(cast):
    # A slower batch size (TOY_STEP_SECONDS here) is the same shape: its runs outvote the old.
    for _ in range(2):
        finished_run(cast.team_a, spp=0.2)
    for _ in range(3):
        finished_run(cast.team_a, spp=0.4, job_env={**TOY_ENV, "TOY_STEP_SECONDS": "0.4"})

    later = toy(cast.team_a, env={**TOY_ENV, "TOY_STEP_SECONDS": "0.4"})

    assert terms.profile_for(later).reference_seconds_per_step == pytest.approx(0.4)


def test_the_steps_and_the_typed_profile_do_not_change_the_shape(cast):
    finished_run(cast.team_a, spp=0.2)
    longer = toy(cast.team_a, total_steps=3000, profile={**TYPED, "model_gb": 5.0})

    assert terms.profile_for(longer).reference_seconds_per_step == pytest.approx(0.2)


def test_editing_a_jobs_command_makes_it_another_shape(cast):
    job = toy(cast.team_a)
    before = job.shape

    job.command = "python other.py"
    job.save(update_fields=["command"])
    job.refresh_from_db()

    assert job.shape != before
    assert job.shape == job.shape_key()


# --- The rent ranks with what the shape measured ------------------------------------------------


def test_the_rent_of_a_second_run_ranks_offers_with_the_first_runs_speeds(
    cast, sandbox, settings, monkeypatch
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)  # no worker here
    finished_run(cast.team_a, spp=0.2, machine_id=None)
    second = toy(cast.team_a)
    now = timezone.now()

    attempt = lifecycle.plan_rent(second.pk, now=now)
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        assert rent.rent(attempt.pk, now=now, client=client) == "rented"
    attempt.refresh_from_db()

    planned = rent_decision.RentDecision.of(attempt)
    assert planned.seconds_per_step == pytest.approx(0.2)
    assert planned.chosen_cost["speed_source"] == selection.SPEED_MODEL
    assert attempt.decision["profile"]["reference_seconds_per_step"] == pytest.approx(0.2)
    assert attempt.decision["profile"]["start_s"] == pytest.approx(8.0)


def test_the_rent_book_holds_the_shapes_speed_on_each_machine(cast):
    finished_run(cast.team_a, spp=0.3, machine_id=42)
    second = toy(cast.team_a)

    book = rent.speed_book(second, [])

    assert book.by_machine == {42: pytest.approx(0.3)}
    assert book.by_model == {"RTX 4090": pytest.approx(0.3)}


# --- In words -----------------------------------------------------------------------------------


def test_the_figures_say_which_were_measured_and_on_how_many_runs(cast):
    finished_run(cast.team_a, spp=0.2, net_rx_bytes=GB)
    finished_run(cast.team_a, spp=0.2, net_rx_bytes=GB)

    lines = {line.figure: line for line in portal_lines(toy(cast.team_a))}

    assert lines["Seconds per step"].source == "measured on 2 runs"
    assert lines["Seconds per step"].value == "0.2 s on RTX 4090"
    assert lines["Downloaded by the command"].value == "1 GB"
    assert lines["Start-up and finish"].measured
    assert lines["Checkpoint size"].source == "typed"
    assert lines["Host for the estimate"].value.startswith("RTX 4090 at $0.369/h")


def test_the_job_page_says_which_figures_were_measured_and_which_typed(client, cast):
    finished_run(cast.team_a, spp=0.2)
    second = toy(cast.team_a)
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[second.pk])).content.decode()
    polled = client.get(reverse("job-detail", args=[second.pk]), HTTP_HX_REQUEST="true")

    assert "What its estimates are made of" in html
    assert "Seconds per step: <span" in html
    assert '0.2 s on RTX 4090</span> <span class="measured">(measured on 1 run)' in html
    assert 'Checkpoint size: <span class="num">none</span> <span class="muted">(typed)' in html
    assert "estimate-figures" not in polled.content.decode()  # the poll leaves it alone


def test_the_preview_says_which_figures_were_measured_on_the_teams_runs(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    spec = JobSpec(**template_spec("toy"))
    first = JobFactory(team=cast.team_a, state="succeeded", **spec.job_fields())
    make_attempt(first, state="ended", gpu_name="RTX 4090", seconds_per_step=0.21, rented_at=T0)
    client.force_login(cast.member)
    form = {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"}

    reply = client.post(reverse("job-new"), {**form, "action": "preview"}, HTTP_HX_REQUEST="true")

    lines = {line.figure: line for line in reply.context["estimate_figures"]}
    assert lines["Seconds per step"].source == "measured on 1 run"
    assert lines["Downloaded by the command"].source == "typed"
    html = reply.content.decode()
    assert "What the estimate is made of" in html
    assert "(measured on 1 run)" in html
    # The offers are ranked at the measured speed, not the template's 4 s.
    chosen = reply.context["preview"].chosen
    assert chosen.train_h == pytest.approx(300 * 0.21 / 3600)


def test_the_preview_of_a_shape_never_run_says_every_figure_was_typed(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    client.force_login(cast.member)
    form = {**spec_to_initial(template_spec("toy")), "team": "team-a", "verified_only": "on"}

    reply = client.post(reverse("job-new"), {**form, "action": "preview"}, HTTP_HX_REQUEST="true")

    assert reply.context["estimate_figures"]
    assert all(line.source == "typed" for line in reply.context["estimate_figures"])
    html = reply.content.decode()
    assert "(measured" not in html
    # The host in words, with the price the setting gives: never the setting's name.
    assert "a reference RTX 4090 at $0.400/h, free traffic" in html
    assert "BUDGET_ESTIMATE_DPH" not in html


def test_the_reference_host_is_named_with_its_price_per_gpu_and_in_all(cast, settings):
    settings.BUDGET_ESTIMATE_DPH = 0.5
    one, four = toy(cast.team_a), toy(cast.team_a, requirements={**RTX_4090, "num_gpus": 4})

    lines = [{f.figure: f for f in figures.estimate_figures(job)} for job in (one, four)]

    assert lines[0]["Host for the estimate"].value == (
        "a reference RTX 4090 at $0.500/h, free traffic"
    )
    assert lines[1]["Host for the estimate"].value == (
        "4 reference RTX 4090 at $0.500/h each ($2.00/h), free traffic"
    )
    assert lines[1]["Host for the estimate"].source == "typed"


def test_a_measured_start_up_prices_an_interruptions_rework_too():
    offer = parse_offer(market_offers()[PLAIN_4090])
    req = selection.Requirements(rental=selection.ON_DEMAND, gpu_names=("RTX 4090",), disk_gb=20)
    typed = selection.JobProfile(image_gb=3.0, model_gb=15.0, upload_gb=1.0, steps_total=300)
    learned = replace(typed, start_s=45.0, pull_s=20.0)
    book = selection.SpeedBook(by_model={"RTX 4090": 4.0})
    rental = selection.Rental(selection.ON_DEMAND)

    cost = selection.expected_cost(offer, learned, book, req, rental, selection.PreemptionRates())

    # Detection and rent, the measured pull and start, and half of a tenth of the run redone;
    # the 15 GB model's time is in the measured start, its traffic is still billed.
    redo_h = 30 * 4.0 / 3600 / 2
    wait_s = selection.DETECTION_S + selection.RENT_S
    assert cost.rework_h == pytest.approx((wait_s + 20 + 45) / 3600 + redo_h)
    assert cost.base.download_gb == pytest.approx(18.0)


def test_the_migration_gives_existing_jobs_the_shape_save_gives_new_ones(cast):
    migration = importlib.import_module("jobs.migrations.0024_shape_without_name_and_env")
    job = toy(cast.team_a, setup="pip install x", requirements={**RTX_4090, "num_gpus": 2})

    assert migration._shape(job) == job.shape
