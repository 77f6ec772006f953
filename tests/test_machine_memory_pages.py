"""Where the team's memory of machines shows, through the Django test client: the offers
preview (on the shipped market, through the sandbox over HTTP) says what a machine's record
adds to its row and leaves out a machine set aside; the job page's decision says why a machine
was set aside; the Machine admin lists each machine's memory and its rentals."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from hosts import selection
from hosts.models import Machine
from hosts.selection import ON_DEMAND, Requirements
from hosts.selection import machine_memory as mm
from jobs.job_templates import template_spec
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory, UserFactory, make_attempt
from tests.support.machines import lose, rented_on
from tests.support.market import FIELD_REPORT_JOB, REFERENCE, make_offer
from tests.support.sandbox import DEFAULT_KEY

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


def preview_rows(client):
    # A run of hours, not the toy's minute: a failed start (minutes of waiting) must move the
    # remembered machine down the ranking, not off the preview's five rows.
    data = {**spec_to_initial(template_spec("toy")), "team": "team-a", "rental": ON_DEMAND}
    data["total_steps"] = 30_000
    response = client.post(reverse("job-new"), {**data, "action": "preview"}, **HX)
    return response.context["preview"].rows, response.content.decode()


def test_the_preview_prices_a_remembered_machine_and_leaves_out_one_set_aside(
    client, cast, sandbox, settings
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, DEFAULT_KEY
    client.force_login(cast.member)
    rows, _ = preview_rows(client)
    machine = rows[0].machine_id
    assert rows[0].memory_words == ""  # nothing remembered yet

    lose(rented_on(machine, at=timezone.now() - timedelta(days=1)), "never_registered")
    rows, html = preview_rows(client)
    [row] = [r for r in rows if r.machine_id == machine]
    assert re.fullmatch(
        rf"machine {machine}: lost 1 of 1 rental in 1 day \(half-life 14 d\): "
        r"\+\$0\.\d+ expected; never ready",
        row.memory_words,
    )
    assert row.memory_words in html

    lose(rented_on(machine), "provider_gone")
    rows, _ = preview_rows(client)
    assert machine not in [r.machine_id for r in rows]


def test_the_job_page_says_which_machine_the_memory_set_aside_and_why(client, cast):
    now = timezone.now()
    records = [
        mm.RentalRecord(now, now - timedelta(days=2), False, incident=mm.NEVER_READY),
        mm.RentalRecord(now, now - timedelta(hours=1), False, incident=mm.LOST_LOADING),
    ]
    memory = mm.MachineMemory({48211: mm.remember(48211, records, now)})
    offers = [make_offer(id=1, machine_id=48211, dph_base=0.2), make_offer(id=2, machine_id=2)]
    req = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",))
    decision = selection.choose_offer(offers, req, FIELD_REPORT_JOB, REFERENCE, memory=memory)
    job = JobFactory(team=cast.team_a, total_steps=300)
    make_attempt(job, state="running", gpu_name="RTX 4090", decision=decision.as_dict())
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[job.id])).content.decode()

    line = re.search(r'id="set-aside-by-memory">(.*?)</p>', html, re.S).group(1)
    assert "machine 48211: 2 incidents in 7 days (never ready, lost while loading)" in line
    assert "machine_memory 1" in html


def test_the_job_page_says_when_the_memory_rented_a_safer_runner_up(client, cast):
    now = timezone.now()
    failed = mm.RentalRecord(now, now - timedelta(days=1), False, incident=mm.NEVER_READY)
    memory = mm.MachineMemory({48211: mm.remember(48211, [failed], now)})
    offers = [
        make_offer(id=1, machine_id=48211, dph_base=0.300),
        make_offer(id=2, machine_id=2, dph_base=0.306),
    ]
    req = Requirements(rental=ON_DEMAND, gpu_names=("RTX 4090",))
    long_run = replace(FIELD_REPORT_JOB, steps_total=18_000)  # a cent an hour outweighs a start
    decision = selection.choose_offer(offers, req, long_run, REFERENCE, memory=memory)
    assert decision.chosen.offer.machine_id == 2
    job = JobFactory(team=cast.team_a, total_steps=18_000)
    make_attempt(job, state="running", gpu_name="RTX 4090", decision=decision.as_dict())
    client.force_login(cast.member)

    html = client.get(reverse("job-detail", args=[job.id])).content.decode()

    said = re.search(r'id="safer-pick">(.*?)</span>', html, re.S).group(1)
    assert said == decision.safer.replace("'", "&#x27;")
    assert said.startswith("machine 2: the team")
    assert "the lowest expected total cost among" not in html


def test_the_machine_admin_lists_each_machines_memory_and_its_rentals(client):
    now = timezone.now()
    lose(
        rented_on(48211, at=now - timedelta(days=9)), "never_registered", at=now - timedelta(days=9)
    )
    ok = rented_on(48211, at=now - timedelta(days=5), registered_at=now - timedelta(days=5))
    lose(ok, "provider_gone", at=now - timedelta(days=4))
    stalled = rented_on(48211, at=now - timedelta(days=2), registered_at=now - timedelta(days=2))
    lose(stalled, "stalled", at=now - timedelta(days=1))
    client.force_login(UserFactory(username="root", is_superuser=True, is_staff=True))

    listing = client.get(reverse("admin:hosts_machine_changelist")).content.decode()
    assert "machine 48211: lost 3 of 3 rentals in 9 days (half-life 14 d)" in listing
    assert "P(fail to start)" in listing
    assert "set aside until" in listing

    machine = Machine.objects.get(machine_id=48211)
    detail = client.get(reverse("admin:hosts_machine_change", args=[machine.pk])).content
    assert b"never_registered" in detail
    assert b"lost while running" in detail  # the inline's incident of the second rental
    rentals = client.get(reverse("admin:hosts_machinerental_changelist") + "?incident=stalled")
    assert rentals.status_code == 200
    assert b"stalled" in rentals.content
