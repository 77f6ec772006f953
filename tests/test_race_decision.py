"""How many instances a hedged rent creates (``hosts.selection.race``): k = 1 unless the wait it
saves, at the job's GPU $/h, is worth more than the losers and the premium of a dearer winner;
and the chance of a failed start, from Vast's reliability2 and the team's own starts."""

from __future__ import annotations

import math

import pytest

from hosts import selection
from hosts.selection import race as odds
from jobs.renting.race import start_failure_chance
from tests.support.market import load_market

READY_S = 100.0
FAIL_S = 600.0


def contender(n: int, **changes) -> odds.Contender:
    values = {
        "offer_id": 100 + n,
        "machine_id": 900 + n,
        "p_fail": 0.25,
        "ready_s": READY_S,
        "fail_s": FAIL_S,
        "usd_per_h": 0.01,  # 50 GB at $0.146/GB-month
        "pull_usd": 0.0,  # a host that bills no download
        "total_usd": 0.15,
    }
    return odds.Contender(**{**values, **changes})


def alike(count: int, **changes) -> list[odds.Contender]:
    return [contender(n, **changes) for n in range(count)]


def test_it_rents_one_host_when_starts_never_fail():
    plan = odds.plan_race(alike(3, p_fail=0.0), hour_value_usd=0.35)

    assert plan.k == 1
    assert plan.wait_s == plan.alone_wait_s == pytest.approx(READY_S)
    assert plan.saved_usd == 0.0  # racing 2 would save nothing, and cost its loser


def test_it_races_when_starts_fail_and_losers_are_cheap_the_more_the_likelier_they_fail():
    rare = odds.plan_race(alike(3, p_fail=0.05), hour_value_usd=0.35)
    often = odds.plan_race(alike(3, p_fail=0.25), hour_value_usd=0.35)

    assert rare.k == 2
    assert [c.offer_id for c in rare.contenders] == [100, 101]
    assert rare.wait_s < rare.alone_wait_s
    assert rare.saved_usd > rare.extra_usd > 0
    assert often.k == odds.RACE_AUTO_MAX == 3
    assert often.saved_usd > rare.saved_usd


def test_the_expected_wait_alone_is_the_start_plus_the_failures_before_it():
    # Alike offers one at a time: W = T + p F / (1 - p); two at a time: p^2 in place of p.
    p = 0.25
    many = alike(40, p_fail=p)

    assert odds.outlook(many, 1).wait_s == pytest.approx(READY_S + p * FAIL_S / (1 - p), rel=1e-3)
    assert odds.outlook(many, 2).wait_s == pytest.approx(
        READY_S + p**2 * FAIL_S / (1 - p**2), rel=1e-3
    )


def test_a_second_host_that_bills_its_pull_is_not_raced():
    # Its 3.2 GB image at $3.9/TB is $0.0125 should it lose: more than the wait it saves.
    dear = [
        contender(0, p_fail=0.1),
        contender(1, p_fail=0.1, pull_usd=3.2 * 0.0039),
        contender(2, p_fail=0.1, pull_usd=0.0125),
    ]

    plan = odds.plan_race(dear, hour_value_usd=0.35)

    assert plan.k == 1
    assert plan.extra_usd > plan.saved_usd  # what racing 2 would have cost and given


def test_a_much_dearer_second_host_is_not_raced():
    # If it wins (half the time: it is as fast), the whole job costs $0.50 more on it.
    plan = odds.plan_race([contender(0), contender(1, total_usd=0.65)], hour_value_usd=0.35)

    assert plan.k == 1


def test_the_faster_host_wins_the_race():
    slow, fast = contender(0, ready_s=200.0, p_fail=0.0), contender(1, ready_s=50.0, p_fail=0.0)

    # Ready times vary (a lognormal spread of 0.4): the slower one is first now and then.
    assert odds.first_ready_odds([slow, fast])[1] > 0.9
    assert odds.first_ready_odds([fast, fast]) == [0.5, 0.5]
    assert odds.outlook([slow, fast], 2).wait_s == pytest.approx(50.0, rel=0.05)
    assert odds.outlook([slow, fast], 1).wait_s == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("setting", "k", "mode"), [("off", 1, "off"), (3, 3, "fixed"), (4, 3, "fixed"), (1, 1, "fixed")]
)
def test_the_jobs_race_setting_overrides_the_decision(setting, k, mode):
    plan = odds.plan_race(alike(3, p_fail=0.0), hour_value_usd=0.35, race=setting)

    assert (plan.k, plan.mode) == (k, mode)


def test_one_machine_is_no_race():
    assert odds.plan_race(alike(1), hour_value_usd=0.35).k == 1


def test_a_loser_is_charged_its_storage_and_the_share_of_its_pull_it_made():
    racer = contender(0, usd_per_h=0.036, pull_usd=0.02, ready_s=100.0)

    assert racer.cost_until(50.0) == pytest.approx(0.036 * 50 / 3600 + 0.02 * 0.5)
    assert racer.cost_until(300.0) == pytest.approx(0.036 * 300 / 3600 + 0.02)


def test_the_reliability_prior_is_noemas_one_in_ten_for_a_reliable_machine():
    assert odds.start_failure_prior(0.999) == pytest.approx(0.10)
    assert odds.start_failure_prior(0.99) == pytest.approx(0.10)
    assert odds.start_failure_prior(0.90) == pytest.approx(0.145)
    assert odds.start_failure_prior(None) == odds.start_failure_prior(0.6) == pytest.approx(0.295)
    assert odds.start_failure_prior(0.0) == odds.START_FAIL_MAX


def test_the_teams_own_starts_move_the_chance_of_a_failed_start():
    assert start_failure_chance(0.99, failed=0, decided=0) == pytest.approx(0.10)
    calm = start_failure_chance(0.99, failed=0, decided=90)  # 90 clean starts: 1 in 100
    stormy = start_failure_chance(0.99, failed=25, decided=90)
    assert calm == pytest.approx(0.01)
    assert stormy == pytest.approx((25 + 1) / 100)
    assert start_failure_chance(0.6, failed=25, decided=90) == pytest.approx(0.26 * 2.95)
    assert start_failure_chance(0.0, failed=90, decided=90) == 0.95  # never certain


def test_it_waits_for_the_start_deadline_of_a_host_that_never_gets_going():
    ready = odds.time_to_ready_s(40.0)

    assert ready == odds.PROVISION_S + 40.0 + odds.REGISTER_S
    assert odds.failure_known_s(ready, deadline_s=1200.0) == pytest.approx(
        0.5 * 1200 + 0.5 * (ready / 2 + odds.POLL_S)
    )


# --- The field report's job on the bundled market ---------------------------------------------

FIELD_JOB = selection.JobProfile(  # examples/qlora/job.toml's profile
    image_gb=3.2,
    model_gb=15.0,
    upload_gb=1.5,
    steps_total=300,
    checkpoint_gb=0.25,
    container_start_s=180,
)
FIELD_REQUIREMENTS = selection.Requirements(  # and its requirements (rental: JobSpec's auto)
    gpu_names=("RTX 4090",),
    min_gpu_ram_gb=23.0,
    min_cuda=12.4,
    disk_gb=50.0,
    rental="auto",
)
# The starts that failed before an agent registered, on the bundled market in each weather
# (``python -m sandbox.first_attempts``: never ready + lost while loading): 3.4 + 3.4 % in
# typical, 9.8 + 14.9 % in bad. What a team's last 50 starts would have shown.
WEATHER_STARTS = {"typical": (3, 50), "bad": (12, 50)}


def bytes_deadline_s(pull_s: float) -> float:
    """The start deadline from bytes as the ``i39-deadlines`` branch sets it for an advertised
    link: Vast's 300 s, three times the pull, 60 s for the agent (its ``start_due``)."""
    return 300.0 + 3 * pull_s + 60.0


def field_contenders(failed: int, decided: int, deadline_s: float | None) -> list[odds.Contender]:
    """The bundled market's candidates for the field report's job, one per machine; DEADLINE_S
    None: the bytes deadline of each."""
    offers, _ = load_market()
    decision = selection.choose_offer(offers, FIELD_REQUIREMENTS, FIELD_JOB, selection.SpeedBook())
    found, seen = [], set()
    for ranked in decision.candidates:
        if ranked.offer.machine_id in seen:
            continue
        seen.add(ranked.offer.machine_id)
        pull_s = ranked.cost.image_pull_h * 3600
        ready = odds.time_to_ready_s(pull_s)
        deadline = deadline_s if deadline_s is not None else bytes_deadline_s(pull_s)
        found.append(
            odds.Contender(
                offer_id=ranked.offer.id,
                machine_id=ranked.offer.machine_id,
                p_fail=start_failure_chance(
                    ranked.offer.reliability, failed=failed, decided=decided
                ),
                ready_s=ready,
                fail_s=odds.failure_known_s(ready, deadline_s=deadline),
                usd_per_h=ranked.offer.storage_usd_per_gb_hour * 50.0,
                pull_usd=3.2 * ranked.offer.download_usd_per_gb,
                total_usd=ranked.expected_total_usd,
            )
        )
    return found, decision.chosen.rental.gpu_usd_per_hour


@pytest.mark.parametrize("weather", ["typical", "bad"])
def test_the_field_reports_job_races_two_hosts_and_not_the_third_that_bills_its_pull(weather):
    failed, decided = WEATHER_STARTS[weather]
    contenders, hour_value = field_contenders(failed, decided, deadline_s=1200.0)

    plan = odds.plan_race(contenders, hour_value_usd=hour_value)

    assert plan.k == 2
    # The third offer bills $3.9/TB: its 3.2 GB pull, lost, costs more than it saves.
    assert contenders[2].pull_usd > 0.01
    three = odds.outlook(contenders, 3)
    alone = odds.outlook(contenders, 1)
    two = odds.outlook(contenders, 2)
    extra_saved = hour_value * (two.wait_s - three.wait_s) / 3600
    assert three.cost_usd - two.cost_usd > extra_saved
    # The losers are well under 3 % of the job's expected total.
    assert plan.extra_usd < 0.03 * contenders[0].total_usd
    assert math.isfinite(alone.wait_s)


@pytest.mark.parametrize(("weather", "k"), [("typical", 1), ("bad", 2)])
def test_with_start_deadlines_from_bytes_the_field_reports_job_races_only_in_bad_weather(
    weather, k
):
    # A never-ready host is given up after about 7 min, not 20: a failed start costs less
    # waiting, so racing pays only where starts fail often.
    failed, decided = WEATHER_STARTS[weather]
    contenders, hour_value = field_contenders(failed, decided, deadline_s=None)

    assert odds.plan_race(contenders, hour_value_usd=hour_value).k == k


@pytest.mark.django_db
def test_a_plain_rent_abandoned_at_its_start_deadline_counts_as_a_failed_start():
    from django.utils import timezone

    from jobs.renting.race import start_failures
    from tests.support.factories import JobFactory, make_attempt

    now = timezone.now()
    job = JobFactory()
    for number, reason in enumerate(("start_overdue", "never_registered", "cancelled"), 1):
        make_attempt(
            job, number=number, state="ended", end_reason=reason, rented_at=now, registered_at=None
        )
    make_attempt(job, number=4, state="running", rented_at=now, registered_at=now)

    assert start_failures(job.team_id, now=now) == (2, 3)  # a cancel says nothing of the host


def test_the_race_plan_knows_a_failed_start_at_the_watchdogs_own_start_deadline():
    from datetime import UTC, datetime

    from jobs.watchdog import start_deadline as sd

    rented = datetime(2026, 12, 6, tzinfo=UTC)
    for held in (False, True):
        plan = sd.StartPlan(rented, 3.6, held, sd.link_for(None, 700.0), 1200.0)
        watchdog_s = (sd.start_due(plan).at - rented).total_seconds()
        assert odds.start_deadline_s(3.6, 700.0, image_held=held, cap_s=1200.0) == pytest.approx(
            watchdog_s
        )
    assert odds.ADVERTISED_MARGIN == sd.ADVERTISED_MARGIN
    assert odds.start_deadline_s(30.0, 100.0, image_held=False, cap_s=1200.0) == 1200.0  # capped
