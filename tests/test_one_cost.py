"""A job's cost is one number with one label on every surface (``billing.cost.job_cost``):
the job page and its spend chart, the job list, the dashboard's month, the member API and the
CLI, the finished notification, the Job admin and the finance pages; recorded until the
invoice covers an attempt, "partly invoiced" with both parts while it covers some, invoiced
after; its breakdown adds up to it. (The public status page shows no job's money.)"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse
from django.utils import timezone

from billing import invoices
from billing.cost import INVOICED, PARTLY_INVOICED, RECORDED, job_cost, shown_parts
from billing.spend import attempt_spend
from jobs import lifecycle
from nomadgpu import api_tokens
from nomadgpu.humanize import money
from nomadgpu_cli import cli
from notify import messages
from tests.support.factories import JobFactory, make_attempt
from tests.support.vast_billing_fake import FakeVastBilling, charge

pytestmark = pytest.mark.django_db(transaction=True)

FIRST, SECOND = 51_001, 51_002


def finished_job(team):
    """Two attempts: one lost after 20 min at $0.31/h, one that ran 18 min at $0.35/h. Each
    registered a minute after its rent (the GPU is billed from then) and the first moved 3 GB."""
    start = timezone.now() - timedelta(hours=1)
    job = JobFactory(team=team, name="one-cost", total_steps=300, created_at=start)
    first, _ = make_attempt(
        job,
        state="running",
        instance_id=FIRST,
        dph_base=0.31,
        disk_gb=40,
        storage_usd_per_gb_hour=0.0002,
        download_usd_per_gb=0.01,
        bytes_down=3 * 1024**3,
        rented_at=start,
        registered_at=start + timedelta(minutes=1),
        running_at=start + timedelta(minutes=3),
    )
    lifecycle.handle_loss(
        lifecycle.Loss(first.pk, "provider_gone"), now=start + timedelta(minutes=20)
    )
    job.refresh_from_db()
    job.state = "starting"
    job.save(update_fields=["state"])
    second, _ = make_attempt(
        job,
        number=2,
        state="starting",
        instance_id=SECOND,
        dph_base=0.35,
        disk_gb=40,
        storage_usd_per_gb_hour=0.0002,
        rented_at=start + timedelta(minutes=22),
        registered_at=start + timedelta(minutes=23),
    )
    lifecycle.mark_running(second, now=start + timedelta(minutes=25))
    second.refresh_from_db()
    lifecycle.handle_exit(second, exit_code=0, reason="exited", now=start + timedelta(minutes=40))
    job.refresh_from_db()
    return job


@pytest.fixture
def job(cast, monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    return finished_job(cast.team_a)


@pytest.fixture
def run_cli(live_server, cast, capsys):
    """The CLI in-process against the live server, as the team admin."""
    token = api_tokens.create_token(user=cast.admin, name="cli", now=timezone.now())[1]

    def run(*argv: str) -> str:
        assert cli.main(["--url", live_server.url, "--token", token, *argv]) == 0
        return capsys.readouterr().out

    return run


def found(pattern: str, text: str) -> tuple[str, str | None]:
    """(amount, label) from the first match of PATTERN's named groups in TEXT (no label group:
    None)."""
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not in {text[:3000]}"
    return match["amount"], match.groupdict().get("label")


LABEL = r"(?P<label>partly invoiced|recorded|invoiced)"
SPLIT = r"(?P<amount>\$[\d.]+ invoiced \+ \$[\d.]+ recorded)"


def every_surface(client, cast, job, run_cli) -> dict[str, tuple[str, str | None]]:
    """(amount, label) of JOB as each surface shows it (the spend chart has no label)."""
    client.force_login(cast.admin)
    first = job.attempts.order_by("number").first().rented_at.date()
    period = f"?start={first}&end={timezone.now().date()}"
    api = client.get(f"/api/jobs/{job.pk}").json()
    listed = next(j for j in client.get("/api/jobs/").json() if j["id"] == job.pk)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    return {
        "job page": found(
            rf'<dt>Cost \({LABEL}\)</dt><dd class="num" id="job-cost">(?P<amount>[^<]+)<', page
        ),
        "spend chart": found(
            r'label="Dollars spent since submit: from \$[\d.]+ to (?P<amount>\$[\d.,]+) ', page
        ),
        "job list": found(
            rf'class="job-cost"[^>]*>(?P<amount>[^<]+)</span> <span class="muted small">{LABEL}<',
            client.get(reverse("job-list")).content.decode(),
        ),
        "dashboard": found(
            rf'id="month-spend">(?P<amount>[^<]+)</span> <span class="muted small">{LABEL}<',
            client.get(reverse("dashboard")).content.decode(),
        ),
        "member API": (api["cost_text"], api["cost_basis"]),
        "member API, money of cost_usd": (money(api["cost_usd"]), api["cost_basis"]),
        "member API list": (listed["cost_text"], listed["cost_basis"]),
        "CLI status": found(rf"cost: (?P<amount>\S+) \({LABEL}", run_cli("status", str(job.pk))),
        "CLI list": found(rf"{job.pk} .*one-cost.* (?P<amount>\$\S+) {LABEL} ", run_cli("status")),
        "finished notification": found(
            rf"Cost \({LABEL}\): (?P<amount>\$[\d.,]+)",
            messages.build(job.events.get(kind="finished")).text,
        ),
        "Job admin": found(
            rf'class="field-cost">(?P<amount>\S+) \({LABEL}',
            client.get(reverse("admin:jobs_job_changelist")).content.decode(),
        ),
        "finance job row": found(
            rf'class="job-cost">(?P<amount>[^<]+) <span class="muted">{LABEL}<',
            client.get(f"/finance/{job.team.slug}/{period}").content.decode(),
        ),
        "finance job page": found(
            rf'Cost \({LABEL}\): <strong id="job-cost">(?P<amount>[^<]+)<',
            client.get(f"/finance/{job.team.slug}/jobs/{job.pk}/").content.decode(),
        ),
    }


def every_split(client, cast, job, run_cli) -> dict[str, str]:
    """A partly invoiced JOB's two parts as each surface that states them writes them."""
    client.force_login(cast.admin)
    first = job.attempts.order_by("number").first().rented_at.date()
    period = f"?start={first}&end={timezone.now().date()}"
    texts = {
        "job page": (
            rf'id="job-cost-split">{SPLIT}<',
            client.get(reverse("job-detail", args=[job.pk])).content.decode(),
        ),
        "CLI status": (rf"cost: \S+ \(partly invoiced: {SPLIT}\)", run_cli("status", str(job.pk))),
        "finished notification": (
            rf"\({SPLIT}\)",
            messages.build(job.events.get(kind="finished")).text,
        ),
        "Job admin": (
            rf"\(partly invoiced: {SPLIT}\)",
            client.get(reverse("admin:jobs_job_changelist")).content.decode(),
        ),
        "finance job row": (
            rf'<span class="muted small">\({SPLIT}\)</span>',
            client.get(f"/finance/{job.team.slug}/{period}").content.decode(),
        ),
        "finance job page": (
            rf"</strong> \({SPLIT}\)",
            client.get(f"/finance/{job.team.slug}/jobs/{job.pk}/").content.decode(),
        ),
    }
    out = {name: found(pattern, text)[0] for name, (pattern, text) in texts.items()}
    return {**out, "member API": client.get(f"/api/jobs/{job.pk}").json()["cost_split_text"]}


def import_invoice(team, job, fake: FakeVastBilling, *, attempts: int = 2, now=None) -> str:
    """Vast bills the first ATTEMPTS attempts (GPU a little over what was recorded, the
    first's 3 GB) and the import runs as the beat's does at NOW; returns the billed total by
    the money rule."""
    first, second = job.attempts.order_by("number")
    fake.charges = [
        charge(FIRST, first.rented_at.date(), gpu_h=0.34, rate=0.31, down_gb=3, down_rate=0.01),
        charge(SECOND, second.rented_at.date(), gpu_h=0.31, rate=0.35),
    ][:attempts]
    team.vast_url, team.vast_api_key = fake.url, "billing-key"
    team.save()
    invoices.sync_team(team, now=now or timezone.now())
    return money(sum(Decimal(str(i["amount"])) for c in fake.charges for i in c["items"]))


def one_month_zone(start, now) -> str:
    """A time zone in which START and NOW fall in the same calendar month, so that the
    dashboard's "this month" holds the whole job (UTC, unless a month began in between)."""
    for zone in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12"):  # 26 hours apart: one fits
        local = ZoneInfo(zone)
        if start.astimezone(local).month == now.astimezone(local).month:
            return zone
    raise AssertionError("no zone holds the job in one month")


def test_one_job_shows_one_cost_and_label_everywhere_before_during_and_after_its_invoice(
    client, cast, job, run_cli, vast_billing
):
    first, second = job.attempts.order_by("number")
    cast.team_a.time_zone = one_month_zone(job.created_at, timezone.now())
    cast.team_a.save(update_fields=["time_zone"])
    before = every_surface(client, cast, job, run_cli)
    # An import that ran while the second attempt was still on its host covers the first only.
    first_billed = import_invoice(
        cast.team_a, job, vast_billing, attempts=1, now=first.ended_at + timedelta(minutes=5)
    )
    during = every_surface(client, cast, job, run_cli)
    splits = every_split(client, cast, job, run_cli)
    billed = import_invoice(cast.team_a, job, vast_billing)
    after = every_surface(client, cast, job, run_cli)

    recorded = before["job page"][0]
    assert {a for a, _ in before.values()} == {recorded}, before
    assert {label for _, label in before.values()} == {RECORDED, None}, before
    assert {a for a, _ in during.values()} == {job_cost(job, covered=first.ended_at).text}, during
    assert {label for _, label in during.values()} == {PARTLY_INVOICED, None}, during
    # The recorded part is what was recorded for the second attempt before any import.
    second_recorded = money(attempt_spend(second, now=timezone.now()).total)
    assert set(splits.values()) == {f"{first_billed} invoiced + {second_recorded} recorded"}
    assert {a for a, _ in after.values()} == {billed}, after
    assert {label for _, label in after.values()} == {INVOICED, None}, after
    assert billed != recorded


def test_the_breakdown_adds_up_to_the_cost_on_the_page_and_in_the_api(client, cast, job):
    client.force_login(cast.admin)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    api = client.get(f"/api/jobs/{job.pk}").json()

    shown = re.search(r'id="job-cost-breakdown">(.*?)</p>', page)[1]
    parts = [Decimal(a) for a in re.findall(r"(?:GPU|storage|download|upload) \$([\d.]+)", shown)]
    total = Decimal(re.search(r'id="job-cost">\$([\d.]+)<', page)[1])
    exact = api["cost_breakdown"]

    assert len(parts) == 4
    assert sum(parts) == total
    assert sum(Decimal(str(exact[k])) for k in ("gpu", "storage", "download", "upload")) == (
        Decimal(str(exact["total"]))
    )
    assert exact["total"] == api["cost_usd"] == api["spend_usd"]
    assert sum(Decimal(t.lstrip("$")) for t in api["cost_breakdown_text"].values()) == total


def test_the_rounding_remainder_goes_to_the_largest_part():
    parts = [
        ("gpu", Decimal("0.003351")),
        ("storage", Decimal("0.00335")),
        ("upload", Decimal("0.00335")),
    ]
    total = sum(v for _, v in parts)  # $0.0101 shown; each part alone rounds to $0.0034

    shown = shown_parts(parts, total)

    assert shown == [
        ("gpu", Decimal("0.0033")),
        ("storage", Decimal("0.0034")),
        ("upload", Decimal("0.0034")),
    ]
    assert sum(v for _, v in shown) == Decimal("0.0101")
