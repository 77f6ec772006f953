"""jobs.renting.image_cache: which machines the team's attempts pulled a job's image on, and the
chance each still holds it (its later rentals there, else the team's rate, else the prior)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.renting import image_cache, shape_history
from jobs.renting.image_cache import (
    MACHINE_WEIGHT,
    PRIOR_KEPT,
    Outcomes,
    Pull,
    chance_image_kept,
    found_the_image,
    outcomes_by_machine,
    team_rate,
)
from tests.support.factories import JobFactory, TeamFactory, make_attempt

T0 = datetime(2026, 11, 4, 12, 0, tzinfo=UTC)
IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"


def pull(machine: int, seconds: float, n: int = 0, transfer_s: float | None = 60.0) -> Pull:
    return Pull(machine, T0 + timedelta(hours=n), seconds, transfer_s)


def test_a_later_rental_found_the_image_when_its_pull_skipped_most_of_the_transfer():
    whole = pull(1, 200.0)  # 140 s of provider start, 60 s of image
    assert found_the_image(pull(1, 145.0, 1), whole)
    assert not found_the_image(pull(1, 190.0, 1), whole)
    # Size or bandwidth unknown: half the whole pull.
    assert found_the_image(pull(1, 90.0, 1, None), whole)
    assert not found_the_image(pull(1, 120.0, 1, None), whole)


def test_a_wiped_machine_pulled_whole_again_and_that_pull_is_the_new_reference():
    pulls = [pull(1, 100, 0), pull(1, 40, 1), pull(1, 100, 2), pull(1, 45, 3), pull(2, 90, 4)]
    assert outcomes_by_machine(pulls) == {1: Outcomes(later=3, found=2), 2: Outcomes(0, 0)}


def test_with_no_later_rental_anywhere_the_chance_is_the_prior():
    outcomes = outcomes_by_machine([pull(7, 100)])
    assert team_rate(outcomes.values()) == pytest.approx(PRIOR_KEPT)
    assert chance_image_kept(outcomes[7], team_rate(outcomes.values())) == pytest.approx(0.8)


def test_a_machine_own_history_outweighs_the_team_rate_as_it_grows():
    team = 0.8
    assert chance_image_kept(Outcomes(later=1, found=0), team) == pytest.approx(1.6 / 3)
    wiped_often = chance_image_kept(Outcomes(later=8, found=0), team)
    assert wiped_often == pytest.approx(MACHINE_WEIGHT * team / (8 + MACHINE_WEIGHT))
    assert chance_image_kept(Outcomes(later=8, found=8), team) > 0.95


@pytest.mark.django_db
def test_the_odds_come_from_the_teams_attempts_that_came_up_with_the_image():
    team = TeamFactory()
    job = JobFactory(team=team, image=IMAGE, profile={"image_gb": 3.0})
    other_image = JobFactory(team=team, image="ubuntu:22.04")
    other_team = JobFactory(image=IMAGE)
    decision = {"chosen": {"offer": {"inet_down_mbps": 500.0}}}  # 3 GiB: 51.5 s

    def came_up(on_job, machine: int, hour: int, seconds: float, number: int) -> None:
        rented = T0 + timedelta(hours=hour)
        make_attempt(
            on_job,
            number=number,
            state="ended",
            machine_id=machine,
            rented_at=rented,
            container_started_at=rented + timedelta(seconds=seconds),
            decision=decision,
        )

    came_up(job, 11, 0, 90, 1)  # machine 11 pulled it ...
    came_up(job, 11, 1, 30, 2)  # ... and a later rental found it
    came_up(job, 12, 2, 95, 3)  # machine 12 pulled it once
    came_up(other_image, 13, 0, 90, 1)  # another image
    came_up(other_team, 14, 0, 90, 1)  # another team
    make_attempt(job, number=4, state="ended", machine_id=15, rented_at=T0)  # never came up

    odds = image_cache.image_cached_odds(team.pk, IMAGE)

    team_share = (1 + 5 * 0.8) / (1 + 5)
    assert set(odds.by_machine) == {11, 12}
    assert odds.chance(11) == pytest.approx((1 + 2 * team_share) / 3)
    assert odds.chance(12) == pytest.approx(team_share)
    assert odds.chance(13) == odds.chance(14) == odds.chance(15) == 0.0
    assert "found on 1 of 1 later rentals here" in odds.words[11]


@pytest.mark.django_db
def test_a_run_whose_machine_held_the_image_does_not_shorten_the_measured_pull():
    job = JobFactory(image=IMAGE)

    def finished(number: int, machine: int, pull_s: float) -> None:
        rented = T0 + timedelta(hours=number)
        up = rented + timedelta(seconds=pull_s)
        make_attempt(
            job,
            number=number,
            state="ended",
            exit_code=0,
            machine_id=machine,
            rented_at=rented,
            container_started_at=up,
            first_step_at=up + timedelta(seconds=30),
            seconds_per_step=1.0,
            step=60,
            ended_at=up + timedelta(seconds=120),
        )

    finished(1, 21, 90.0)  # a whole pull on machine 21
    finished(2, 21, 10.0)  # machine 21 held it: no pull
    finished(3, 22, 80.0)  # a whole pull elsewhere

    startup = shape_history.history_for(job).startup

    assert startup.pull_s == pytest.approx(85.0)  # the median of the whole pulls, not 80
    assert startup.runs == 1


@pytest.mark.django_db
def test_the_rentals_that_found_the_image_are_named_and_left_out_of_the_pull():
    job = JobFactory(image=IMAGE)
    for number, pull_s in ((1, 90.0), (2, 10.0)):
        rented = T0 + timedelta(hours=number)
        up = rented + timedelta(seconds=pull_s)
        make_attempt(
            job,
            number=number,
            state="ended",
            exit_code=0,
            machine_id=21,
            rented_at=rented,
            container_started_at=up,
            first_step_at=up,
            seconds_per_step=1.0,
            step=10,
            ended_at=up + timedelta(seconds=20),
        )
    # Only the first counts as a whole pull: the measured pull is that one.
    assert shape_history.history_for(job).startup.pull_s == pytest.approx(90.0)
    found = image_cache.attempts_that_found_the_image(job.team_id, IMAGE)
    assert found == {job.attempts.get(number=2).pk}
