"""Which download source wins for the image pull (``billing.image_pull``): a machine that never
ran the image pulled it whole, from the rent; one that held it pulled only when the poll saw
it load for half the image's transfer; the poll keeps its first ``loading`` and ``running``
reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from billing import image_pull
from billing.spend import GB, attempt_spend, traffic_bytes
from hosts import vast
from jobs.models import Attempt
from jobs.watchdog.poll import note_provider_status
from tests.support.factories import make_attempt

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
# 3 GiB over 1,000 Mbit/s: 25.8 s to move, so a load of 12.9 s or more pulled it.
OFFER = {"id": 1, "machine_id": 77, "inet_down_mbps": 1000.0}


def decision(chance: float | None) -> dict:
    """A rent decision as ``selection.Decision.as_dict`` keeps it: the profile's image, the
    chosen offer and the chance the rent gave its machine of still holding the image."""
    cost = {} if chance is None else {"image_cached_chance": chance}
    return {"profile": {"image_gb": 3.0}, "chosen": {"offer": OFFER, "cost": cost}}


def attempt_on(chance: float | None, **moments):
    attempt, _ = make_attempt(
        state="running",
        rented_at=T0,
        decision=decision(chance),
        download_usd_per_gb=0.02,
        **moments,
    )
    return attempt


def test_without_a_rent_decision_no_pull_is_recorded():
    attempt, _ = make_attempt(state="running", rented_at=T0, net_rx_bytes=GB)

    assert image_pull.recorded_pull(attempt, now=T0) == image_pull.Pull(0, image_pull.NO_DECISION)
    assert traffic_bytes(attempt, now=T0) == (GB, 0)


@pytest.mark.parametrize("chance", [None, 0.0])
def test_a_machine_that_never_ran_the_image_pulled_it_whole_from_the_rent(chance):
    attempt = attempt_on(chance)  # nothing seen yet: the pull is under way

    pull = image_pull.recorded_pull(attempt, now=T0 + timedelta(seconds=1))

    assert pull == image_pull.Pull(3 * GB, image_pull.NEVER_ON_MACHINE)
    assert attempt_spend(attempt, now=T0 + timedelta(seconds=1)).download == pytest.approx(0.06)


def test_a_machine_that_held_the_image_and_started_at_once_records_no_pull():
    # The poll never read `loading`: the container was up within one poll interval.
    attempt = attempt_on(
        0.8,
        net_rx_bytes=GB // 2,
        provider_running_at=T0 + timedelta(seconds=70),
        container_started_at=T0 + timedelta(seconds=65),
    )

    now = T0 + timedelta(minutes=5)
    assert image_pull.recorded_pull(attempt, now=now) == image_pull.Pull(0, image_pull.KEPT)
    assert traffic_bytes(attempt, now=now) == (GB // 2, 0)  # the counters alone


def test_a_short_load_on_a_machine_that_held_the_image_is_no_pull():
    attempt = attempt_on(
        0.8,
        provider_loading_at=T0 + timedelta(seconds=60),
        container_started_at=T0 + timedelta(seconds=65),  # a container start: 5 s
    )

    assert image_pull.recorded_pull(attempt, now=T0 + timedelta(minutes=5)).bytes == 0


def test_a_load_as_long_as_a_pull_on_a_machine_that_held_the_image_is_a_pull():
    # The host wiped the image meanwhile: it loaded for 30 s, more than half of 25.8 s.
    attempt = attempt_on(
        0.8,
        provider_loading_at=T0 + timedelta(seconds=60),
        container_started_at=T0 + timedelta(seconds=90),
    )

    pull = image_pull.recorded_pull(attempt, now=T0 + timedelta(minutes=5))

    assert pull == image_pull.Pull(3 * GB, image_pull.LOADED_LONG)


def test_a_load_still_under_way_counts_as_a_pull_once_it_lasted_half_the_transfer():
    attempt = attempt_on(0.8, provider_loading_at=T0 + timedelta(seconds=60))

    assert image_pull.recorded_pull(attempt, now=T0 + timedelta(seconds=70)).bytes == 0
    assert image_pull.recorded_pull(attempt, now=T0 + timedelta(seconds=75)).bytes == 3 * GB


def test_half_the_transfer_at_the_offers_bandwidth_is_the_line():
    transfer = image_pull.transfer_seconds(3.0, 1000.0)

    assert transfer == pytest.approx(3 * GB * 8 / 1e9)
    assert image_pull.shows_a_pull(transfer / 2, transfer)
    assert not image_pull.shows_a_pull(transfer / 2 - 0.1, transfer)
    assert not image_pull.shows_a_pull(600.0, None)  # no bandwidth known: nothing to tell by


def instance(status: str) -> vast.Instance:
    return vast.parse_instance({"id": 9, "actual_status": status, "machine_id": 77})


def test_the_poll_keeps_its_first_loading_and_running_reads():
    attempt = attempt_on(0.8, instance_id=9)

    for n, status in enumerate(["created", "loading", "loading", "running", "running"]):
        note_provider_status(attempt, instance(status), now=T0 + timedelta(seconds=10 * n))

    attempt = Attempt.objects.get(pk=attempt.pk)
    assert attempt.provider_loading_at == T0 + timedelta(seconds=10)
    assert attempt.provider_running_at == T0 + timedelta(seconds=30)
    assert attempt.provider_status == "running"


# --- Docker's own words, relayed in status_msg while the instance loads ----------------------


@pytest.mark.parametrize(
    ("status_msg", "seen"),
    [
        ("Status: Image is up to date for pytorch/pytorch:2.4.0", vast.IMAGE_KEPT),
        ("2.4.0: Pulling from pytorch/pytorch", vast.IMAGE_PULLED),
        ("0d30c18b26f8: Downloading 1.21GB/3.6GB", vast.IMAGE_PULLED),
        ("Status: Downloaded newer image for pytorch/pytorch:2.4.0", vast.IMAGE_PULLED),
        ("0d30c18b26f8: Already exists", None),  # one layer: says nothing of the image
        ("", None),
        (None, None),
    ],
)
def test_dockers_words_say_whether_the_image_was_pulled(status_msg, seen):
    assert vast.image_pull_seen(status_msg) == seen


def test_dockers_words_win_over_the_machines_history_and_the_loads_length():
    # The team never ran the image there, but another renter had: Docker said so.
    kept = attempt_on(0.0, provider_pull_seen=vast.IMAGE_KEPT)
    # The team's history said the machine held it, and the load was short: Docker pulled.
    pulled = attempt_on(
        0.8,
        provider_pull_seen=vast.IMAGE_PULLED,
        provider_loading_at=T0 + timedelta(seconds=60),
        container_started_at=T0 + timedelta(seconds=62),
    )

    now = T0 + timedelta(minutes=5)
    assert image_pull.recorded_pull(kept, now=now) == image_pull.Pull(0, image_pull.SAID_KEPT)
    assert image_pull.recorded_pull(pulled, now=now) == image_pull.Pull(
        3 * GB, image_pull.SAID_PULLED
    )


def loading(status_msg: str) -> vast.Instance:
    return vast.parse_instance(
        {"id": 9, "actual_status": "loading", "status_msg": status_msg, "machine_id": 77}
    )


def test_the_poll_keeps_dockers_first_words_read_while_loading():
    attempt = attempt_on(0.8, instance_id=9)

    note_provider_status(attempt, loading("Pulling fs layer"), now=T0)
    attempt = Attempt.objects.get(pk=attempt.pk)
    note_provider_status(attempt, loading("Status: Image is up to date for x"), now=T0)
    attempt = Attempt.objects.get(pk=attempt.pk)
    running = vast.parse_instance({"id": 9, "actual_status": "running", "status_msg": "x"})
    note_provider_status(attempt, running, now=T0)

    assert Attempt.objects.get(pk=attempt.pk).provider_pull_seen == vast.IMAGE_PULLED


def test_words_read_outside_loading_are_not_about_the_pull():
    attempt = attempt_on(0.8, instance_id=9)
    running = vast.parse_instance(
        {"id": 9, "actual_status": "running", "status_msg": "Downloading 1GB/2GB"}
    )

    note_provider_status(attempt, running, now=T0)

    assert Attempt.objects.get(pk=attempt.pk).provider_pull_seen == ""
