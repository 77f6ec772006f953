"""The public status page through HTTP: HTML, JSON, Atom feed and badge; what must not leak;
opted-out and unknown teams; supervisor health; the brief cache."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.cache import cache

from jobs.models import Interruption, JobState
from jobs.watchdog.poll import poll_providers
from nomadgpu.models import Role, ServiceHeartbeat
from tests.support.factories import (
    InterruptionFactory,
    JobFactory,
    MembershipFactory,
    ServiceHeartbeatFactory,
    TeamFactory,
    make_attempt,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ATOM = "{http://www.w3.org/2005/Atom}"
INSTANCE_SUFFIX = itertools.cycle(range(10))

# Distinctive strings planted in the team's jobs, hosts and people: none may reach the public.
SECRETS = {
    "job name": "zz-private-llama-run",
    "command": "zz-train-cmd --hf-token=zzcmdtoken",
    "image": "registry.zz-private.example/llm:zz-tag",
    "instance id": "98765432",  # every instance id starts with these digits
    "machine id": "55501234",
    "offer id": "44403210",
    "price": "0.7777",
    "gpu error": "zz-xid-79-on-host",
    "member": "zz-zelda-member",
    "log": "zz-log-line",
}


@pytest.fixture(autouse=True)
def empty_cache():
    # The views cache numbers for 30 s per team and window; each test starts from nothing.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def interrupt(job, number: int, detected_at: datetime, **fields) -> Interruption:
    attempt, _ = make_attempt(
        job,
        number=number,
        state="ended",
        instance_id=int(SECRETS["instance id"]) * 10 + next(INSTANCE_SUFFIX),
        machine_id=int(SECRETS["machine id"]),
        offer_id=int(SECRETS["offer id"]) + number,
        dph_base=float(SECRETS["price"]),
        gpu_error=SECRETS["gpu error"],
        log_tail=SECRETS["log"],
        label=f"ngpu:test:{job.pk}:{number}",
    )
    fields.setdefault("cause", "provider_gone")
    fields.setdefault("detail", f"{SECRETS['gpu error']} on machine {SECRETS['machine id']}")
    return InterruptionFactory(attempt=attempt, detected_at=detected_at, **fields)


@pytest.fixture
def public(db):
    """An opted-in team (Berlin time) with three interruptions over the last week: back on a
    machine 1 and 8 minutes after the loss (the last heartbeat, 30 s before the detection),
    training again 5 minutes after that, and one cancelled before recovery."""
    team = TeamFactory(
        name="Open Lab", slug="open-lab", time_zone="Europe/Berlin", public_status_page=True
    )
    MembershipFactory(team=team, user__username=SECRETS["member"], role=Role.ADMIN)
    job = JobFactory(
        team=team,
        name=SECRETS["job name"],
        command=SECRETS["command"],
        image=SECRETS["image"],
        state=JobState.RUNNING,
    )
    for number, (ago, back_s) in enumerate([(1, 60), (2, 480)], start=1):
        detected = NOW - timedelta(days=ago)
        interrupt(
            job,
            number,
            detected,
            last_heartbeat_at=detected - timedelta(seconds=30),
            replacement_rented_at=detected + timedelta(seconds=10),
            running_again_at=detected + timedelta(seconds=back_s - 30),
            training_again_at=detected + timedelta(seconds=back_s - 30 + 300),
            step_reached=180,
            resumed_step=100 * number,
        )
    interrupt(job, 3, NOW - timedelta(days=3), cancelled_before_recovery=True)
    return team


def parse_xml(body: bytes) -> ET.Element:
    return ET.fromstring(body)  # noqa: S314 (our own response, in a test)


def svg_texts(body: bytes) -> list[str | None]:
    return [t.text for t in parse_xml(body).iter("{http://www.w3.org/2000/svg}text")]


def urls(slug: str) -> list[str]:
    return [f"/status/{slug}/", f"/status/{slug}.json", f"/status/{slug}/feed.atom",
            f"/status/{slug}/badge.svg"]  # fmt: skip


def test_the_page_shows_the_numbers_the_chart_and_the_history(client, public, frozen):
    response = client.get("/status/open-lab/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="n-interruptions">3<' in html
    assert 'id="n-resumed">2<' in html
    assert 'id="n-cancelled">1<' in html
    assert 'id="n-back-median">1 min<' in html
    assert 'id="n-back-p90">8 min<' in html
    assert 'id="n-training-median">6 min<' in html
    assert 'id="n-training-p90">13 min<' in html
    assert 'id="n-detection-median">30 s<' in html
    assert 'id="n-running-now">1<' in html
    assert html.count('<rect class="bar"') == 30
    assert html.count('<tr id="incident-') == 3
    assert "instance vanished at the provider" in html
    assert "13:00" in html  # detected 12:00 UTC = 13:00 in Berlin (CET)
    assert "<script" not in html  # works without JavaScript


def test_the_window_switcher_is_plain_links(client, public, frozen):
    html = client.get("/status/open-lab/?days=7").content.decode()

    assert '<a href="?days=7" aria-current="page">7 days</a>' in html
    assert '<a href="?days=90">90 days</a>' in html
    assert html.count('<rect class="bar"') == 7


def test_an_unpublished_window_is_a_bad_request(client, public):
    for url in urls("open-lab")[:2] + urls("open-lab")[3:]:
        assert client.get(url, {"days": "14"}).status_code == 400


def test_the_json_is_versioned_and_complete(client, public, frozen):
    response = client.get("/status/open-lab.json", {"days": "7"})

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["version"] == 3  # 3: the two figures from the loss; the version-2 keys stay
    assert body["team"] == {"slug": "open-lab", "name": "Open Lab"}
    assert body["time_zone"] == "Europe/Berlin"
    assert body["generated_at"] == "2026-11-29T13:00:00+01:00"
    assert body["window"] == {"days": 7, "since": "2026-11-23T00:00:00+01:00"}
    assert (body["interruptions"], body["resumed"], body["cancelled_before_recovery"]) == (3, 2, 1)
    assert body["recovering"] == 0
    assert body["percentile_method"] == "nearest-rank"
    assert body["back_on_machine_s"] == {"count": 2, "median": 60.0, "p90": 480.0}
    assert body["training_again_s"] == {"count": 2, "median": 360.0, "p90": 780.0}
    assert body["running_again_s"] == body["training_again_s"]  # version 2's name
    assert body["detection_s"] == {"count": 2, "median": 30.0, "p90": 30.0}
    assert body["jobs_running_now"] == 1
    assert len(body["daily"]) == 7
    assert body["daily"][-2] == {"date": "2026-11-28", "interruptions": 1}
    newest = body["incidents"][0]
    assert set(newest) == {
        "ref", "cause", "cause_label", "outcome", "detected_at", "lost_at",
        "back_on_machine_at", "training_again_at", "back_on_machine_s", "training_again_s",
        "running_again_at", "resumed_step",
    }  # fmt: skip
    assert newest["detected_at"] == "2026-11-28T13:00:00+01:00"
    assert newest["lost_at"] == "2026-11-28T12:59:30+01:00"
    assert newest["back_on_machine_at"] == "2026-11-28T13:00:30+01:00"
    assert newest["training_again_at"] == "2026-11-28T13:05:30+01:00"
    assert (newest["back_on_machine_s"], newest["training_again_s"]) == (60.0, 360.0)
    assert newest["running_again_at"] == newest["back_on_machine_at"]  # version 2's name
    assert (newest["outcome"], newest["resumed_step"]) == ("resumed", 100)
    assert body["incidents"][-1]["outcome"] == "cancelled"
    assert set(body["health"]) == {
        "watchdog", "worker_and_beat", "provider", "agent_api_outages", "jobs_needing_attention",
    }  # fmt: skip
    assert body["health"]["agent_api_outages"] == []
    assert body["health"]["jobs_needing_attention"] == 0


def test_the_atom_feed_lists_the_interruptions(client, public, frozen):
    response = client.get("/status/open-lab/feed.atom")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/atom+xml")
    feed = parse_xml(response.content)
    assert feed.tag == f"{ATOM}feed"
    entries = feed.findall(f"{ATOM}entry")
    assert len(entries) == 3
    first = entries[0]
    assert first.findtext(f"{ATOM}title") == (
        "Host lost: instance vanished at the provider (resumed)"
    )
    assert (
        first.find(f"{ATOM}link")
        .get("href")
        .startswith("http://testserver/status/open-lab/#incident-")
    )
    summary = first.findtext(f"{ATOM}summary")
    assert "Back on a machine after 1 min." in summary
    assert "Training again after 6 min, resumed from step 100." in summary
    assert "cancelled before it recovered" in entries[2].findtext(f"{ATOM}summary")


def test_the_badge_shows_the_p90_until_training_again(client, public, frozen):
    response = client.get("/status/open-lab/badge.svg")

    # The time a user waits (the loss -> the first step after it: 360 s and 780 s), not the 1
    # and 8 minutes until a replacement was running.
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert svg_texts(response.content) == ["training again p90", "13 min"]
    assert parse_xml(response.content).get("aria-label") == "training again p90: 13 min"


def test_a_team_with_nothing_yet_says_so(client, db, frozen):
    TeamFactory(slug="quiet", public_status_page=True)

    assert "No interruptions in the last 30 days." in client.get("/status/quiet/").content.decode()
    badge = svg_texts(client.get("/status/quiet/badge.svg").content)
    assert badge == ["training again p90", "no data"]
    assert client.get("/status/quiet.json").json()["back_on_machine_s"]["median"] is None


def test_nothing_private_reaches_any_of_the_four(client, public, frozen):
    bodies = {url: client.get(url).content.decode() for url in urls("open-lab")}
    bodies["90-day page"] = client.get("/status/open-lab/?days=90").content.decode()

    for url, body in bodies.items():
        assert "Open Lab" in body or url.endswith("badge.svg")
        for what, secret in SECRETS.items():
            assert secret not in body, f"{what} leaks through {url}"


@pytest.mark.parametrize("slug", ["hidden", "no-such-team"])
def test_an_opted_out_or_unknown_team_is_404_everywhere(client, db, slug):
    team = TeamFactory(slug="hidden", public_status_page=False)
    interrupt(JobFactory(team=team), 1, NOW)

    for url in urls(slug):
        assert client.get(url).status_code == 404, url


def test_opting_out_takes_effect_despite_the_cache(client, public):
    assert client.get("/status/open-lab.json").status_code == 200

    public.public_status_page = False
    public.save()

    assert client.get("/status/open-lab.json").status_code == 404


def test_numbers_are_cached_briefly_per_team_and_window(client, public, frozen):
    first = client.get("/status/open-lab.json").json()
    interrupt(JobFactory(team=public), 1, NOW - timedelta(hours=1))

    again = client.get("/status/open-lab.json")
    assert again.json()["interruptions"] == first["interruptions"] == 3
    assert again["Cache-Control"] in ("public, max-age=30", "max-age=30, public")
    assert client.get("/status/open-lab.json", {"days": "7"}).json()["interruptions"] == 4

    with time_machine.travel(NOW + timedelta(seconds=31), tick=False):
        assert client.get("/status/open-lab.json").json()["interruptions"] == 4


def health(client) -> dict:
    cache.clear()
    return client.get("/status/open-lab.json").json()["health"]


def test_health_says_the_watchdog_ticks_while_its_heartbeat_is_fresh(client, public, settings):
    settings.WATCHDOG_INTERVAL_S = 5
    with time_machine.travel(NOW, tick=False):
        assert health(client)["watchdog"] == {"ok": False, "last_seen_at": None, "silent_s": None}

        ServiceHeartbeatFactory(name="watchdog", last_seen_at=NOW - timedelta(seconds=14))
        body = health(client)
        assert body["watchdog"] == {
            "ok": True,
            "last_seen_at": "2026-11-29T11:59:46+00:00",
            "silent_s": None,
        }
        assert body["worker_and_beat"]["ok"] is True

        ServiceHeartbeat.objects.filter(name="watchdog").update(
            last_seen_at=NOW - timedelta(seconds=16)
        )
        body = health(client)
        assert (body["watchdog"]["ok"], body["worker_and_beat"]["ok"]) == (False, False)
        assert body["watchdog"]["silent_s"] == 16
        page = client.get("/status/open-lab/").content.decode()
        assert "watchdog has not run for 16 s" in page


def test_health_says_whether_the_last_provider_poll_worked(client, public, settings):
    settings.WATCHDOG_INTERVAL_S, settings.PROVIDER_POLL_INTERVAL_S = 5, 10
    with time_machine.travel(NOW, tick=False):
        assert health(client)["provider"]["ok"] is None  # never polled

        beat = ServiceHeartbeatFactory(
            name="provider", last_seen_at=NOW - timedelta(seconds=20), detail={"ok": True}
        )
        assert health(client)["provider"]["ok"] is True

        beat.detail = {"ok": False, "error": "http://10.9.8.7:8700: HTTP 401 zz-bad-key"}
        beat.save()
        page = client.get("/status/open-lab/").content.decode()
        assert health(client)["provider"]["ok"] is False
        assert "zz-bad-key" not in page
        assert "10.9.8.7" not in page

        ServiceHeartbeat.objects.filter(name="provider").update(
            last_seen_at=NOW - timedelta(seconds=46)
        )
        assert health(client)["provider"]["ok"] is None  # too old to say


def test_the_provider_poll_records_whether_the_provider_answered(db, sandbox, settings):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    poll_providers(NOW)
    beat = ServiceHeartbeat.objects.get(name="provider")
    assert (beat.last_seen_at, beat.detail) == (NOW, {"ok": True, "error": ""})

    settings.VAST_API_KEY = "not-a-key-of-this-account"
    poll_providers(NOW + timedelta(seconds=10))
    beat.refresh_from_db()
    assert beat.last_seen_at == NOW + timedelta(seconds=10)
    assert beat.detail["ok"] is False
    assert sandbox.url in beat.detail["error"]


def test_the_team_page_links_the_status_page_only_when_public(client, cast):
    client.force_login(cast.member)
    assert "/status/team-a/" not in client.get("/teams/team-a/").content.decode()

    cast.team_a.public_status_page = True
    cast.team_a.save()
    assert (
        '<a href="/status/team-a/">Public status page</a>'
        in client.get("/teams/team-a/").content.decode()
    )
