"""Market weather on the public status page, through HTTP: per GPU model from the team's own
rentals in the window, rent → ready (median, p90), the share of decided starts that got ready
and host losses per rented hour; a model shows only with at least 20 rentals, and neither the
page nor the JSON names a machine, an instance or a job."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.cache import cache

from statuspage import weather
from tests.support.factories import InterruptionFactory, JobFactory, TeamFactory, make_attempt

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
JOB_NAME = "zz-private-weather-run"
MACHINE = 55501234
INSTANCE = 98765432
INSTANCE_IDS = itertools.count(INSTANCE * 1000)  # every instance id starts with INSTANCE


@pytest.fixture(autouse=True)
def frozen():
    cache.clear()
    with time_machine.travel(NOW, tick=False):
        yield
    cache.clear()


@pytest.fixture
def team():
    return TeamFactory(slug="open-lab", public_status_page=True, time_zone="UTC")


def rentals(team, gpu: str, ready_s: list[float | None], *, lost: int = 0, outbid: int = 0):
    """One job's attempts on GPU, one per READY_S (None: never ready), each rented an hour ago
    and ended now; the first LOST of them lost their host, the next OUTBID were outbid."""
    job = JobFactory(team=team, name=JOB_NAME)
    rented = NOW - timedelta(hours=1)
    for n, ready in enumerate(ready_s, 1):
        attempt, _ = make_attempt(
            job,
            number=n,
            state="ended",
            gpu_name=gpu,
            machine_id=MACHINE,
            instance_id=next(INSTANCE_IDS),
            rented_at=rented,
            registered_at=None if ready is None else rented + timedelta(seconds=ready),
            ended_at=NOW,
        )
        if n <= lost + outbid:
            cause = "provider_gone" if n <= lost else "outbid"
            InterruptionFactory(attempt=attempt, job=job, cause=cause, detected_at=NOW)


def test_a_model_shows_with_twenty_rentals_and_one_rented_less_is_counted_never_named(client, team):
    # 20 RTX 4090 rentals: 18 ready after 60..230 s, 2 lost before ready; 1 more lost running
    # and 1 outbid (not a host loss).
    ready = [60.0 + 10 * i for i in range(18)]
    rentals(team, "RTX 4090", [None, None, *ready], lost=3, outbid=1)
    rentals(team, "RTX 3090", [50.0] * 19)  # one short of the threshold

    html = client.get("/status/open-lab/").content.decode()
    data = client.get("/status/open-lab.json").json()["market_weather"]

    assert data["min_rentals"] == weather.MIN_RENTALS == 20
    assert data["models_hidden"] == 1
    [cell] = data["models"]
    assert cell["gpu_name"] == "RTX 4090"
    assert cell["rentals"] == 20
    # Nearest rank over 18 values: the 9th (140 s) and the 17th (220 s).
    assert cell["rent_to_ready_s"] == {"count": 18, "median": 140.0, "p90": 220.0}
    # Decided: 18 ready and 2 lost before ready; the third loss came after its host was ready.
    assert cell["start_success"] == {"decided": 20, "ready": 18, "share": 0.9}
    assert cell["host_losses"] == {"losses": 3, "rented_h": 20.0, "per_rented_hour": 0.15}
    assert "RTX 3090" not in html
    assert "1 more GPU model rented fewer than 20 times" in html
    assert "90 %" in html
    for secret in (JOB_NAME, str(MACHINE), str(INSTANCE)):
        assert secret not in html
        assert secret not in str(data)


def test_no_model_with_twenty_rentals_says_so(client, team):
    rentals(team, "RTX 4090", [60.0] * 5)

    html = client.get("/status/open-lab/").content.decode()

    assert 'id="weather-none"' in html
    assert client.get("/status/open-lab.json").json()["market_weather"]["models"] == []


def test_a_rental_still_starting_or_cancelled_before_ready_is_no_start_decided(team):
    job = JobFactory(team=team)
    rented = NOW - timedelta(minutes=5)
    make_attempt(job, number=1, state="starting", gpu_name="A100", rented_at=rented)
    make_attempt(
        job, number=2, state="ended", gpu_name="A100", rented_at=rented, ended_at=NOW
    )  # cancelled before its host came up: no interruption

    found = weather.market_weather(team, since=NOW - timedelta(days=30), now=NOW)

    assert found.models == ()
    [model] = [
        weather.model_weather(
            "A100", [(rented, None, None, False), (rented, None, NOW, False)], now=NOW
        )
    ]
    assert (model.rentals, model.decided, model.start_success) == (2, 0, None)
