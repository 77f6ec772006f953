"""The portal's job pages through the test client: full pages without htmx, fragments with
``HX-Request``; submission through JobSpec; offers before submit on the sandbox; cancel;
checkpoint downloads (plain and decrypted)."""

from __future__ import annotations

import base64
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.job_templates import template_spec
from jobs.models import Job
from nomadgpu.humanize import money
from portal.forms import spec_to_initial
from tests.support.factories import (
    CheckpointFactory,
    InterruptionFactory,
    JobEventFactory,
    JobFactory,
    LossPointFactory,
    MembershipFactory,
    make_attempt,
)

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


def running_job(team, **fields):
    now = timezone.now()
    job = JobFactory(team=team, total_steps=300, **fields)
    attempt, _ = make_attempt(
        job,
        state="running",
        gpu_name="RTX 4090",
        step=120,
        total_steps=300,
        seconds_per_step=0.5,
        dph_base=0.36,
        storage_usd_per_gb_hour=0.0002,
        disk_gb=20,
        rented_at=now - timedelta(minutes=10),
        registered_at=now - timedelta(minutes=9),
        log_tail="step 120 loss 0.4321\n",
    )
    return job, attempt


def toy_form(**overrides):
    data = {**spec_to_initial(template_spec("toy")), "team": "team-a", **overrides}
    data["verified_only"] = "on"
    return data


# --- list and dashboard -----------------------------------------------------------------------


def test_job_list_shows_progress_eta_spend_host_and_interruptions(member_client, cast):
    _job, attempt = running_job(cast.team_a)
    InterruptionFactory(attempt=attempt, cause="provider_gone", detected_at=timezone.now())

    response = member_client.get(reverse("job-list"))

    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html
    assert 'value="120"' in html
    assert "120/300" in html
    assert "1 min 30 s" in html  # (300 - 120) steps x 0.5 s (nomadgpu.humanize.duration)
    assert "RTX 4090" in html
    assert 'hx-trigger="every 3s"' in html


def test_job_list_with_htmx_answers_only_the_rows(member_client, cast):
    running_job(cast.team_a)

    response = member_client.get(reverse("job-list"), **HX)

    html = response.content.decode()
    assert "<html" not in html
    assert html.strip().startswith('<tbody id="job-rows"')
    assert 'hx-trigger="every 3s"' in html


def test_job_list_stops_polling_when_every_job_has_finished(member_client, cast):
    JobFactory(team=cast.team_a, state="succeeded", final_step=300, total_steps=300)

    html = member_client.get(reverse("job-list"), **HX).content.decode()

    assert "every 3s" not in html
    assert "300/300" in html


def test_job_list_shows_only_the_current_teams_jobs(member_client, cast):
    JobFactory(team=cast.team_a, name="ours")
    JobFactory(team=cast.team_b, name="theirs")

    html = member_client.get(reverse("job-list")).content.decode()

    assert "ours" in html
    assert "theirs" not in html


def test_dashboard_shows_spend_this_month(member_client, cast):
    running_job(cast.team_a)  # 9 min GPU at $0.36/h ~ $0.054 plus storage

    html = member_client.get(reverse("dashboard")).content.decode()

    assert "Spend this month" in html
    assert "$0.05" in html


# --- submit -----------------------------------------------------------------------------------


def test_new_job_page_prefills_the_toy_template(member_client):
    html = member_client.get(reverse("job-new") + "?template=toy").content.decode()

    assert 'value="toy"' in html
    assert "TOY_STEPS=300" in html
    assert "RTX 4090" in html


def test_new_job_page_prefills_the_field_report_template(member_client):
    html = member_client.get(reverse("job-new") + "?template=qlora").content.decode()

    assert "Qwen/Qwen2.5-7B-Instruct" in html
    assert 'value="15.0"' in html  # model download GB for the cost model


def test_invalid_fields_show_specific_errors_inline(member_client):
    response = member_client.post(
        reverse("job-new"), toy_form(num_gpus="40", env="NOMAD_TOKEN=x", image="has space")
    )

    form = response.context["form"]
    assert response.status_code == 200
    assert form.errors["num_gpus"] == ["Input should be less than or equal to 16"]
    assert "NOMAD_* variables are set by the agent" in form.errors["env"][0]
    assert "image" in form.errors
    assert Job.objects.count() == 0


def test_a_valid_submission_creates_the_job_and_opens_its_page(member_client, cast):
    response = member_client.post(reverse("job-new"), toy_form(budget_usd="2.50"))

    job = Job.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("job-detail", args=[job.id])
    assert job.team == cast.team_a
    assert job.created_by == cast.member
    assert job.requirements["gpu_names"] == ["RTX 4090"]
    assert job.budget_usd == Decimal("2.50")
    assert job.env["TOY_STEPS"] == "300"


def test_submitting_to_another_team_is_404(member_client):
    response = member_client.post(reverse("job-new"), toy_form(team="team-b"))

    assert response.status_code == 404
    assert Job.objects.count() == 0


def test_preview_with_htmx_shows_offers_and_estimate_from_the_sandbox(
    member_client, sandbox, settings
):
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = "sandbox-key"

    response = member_client.post(reverse("job-new"), {**toy_form(), "action": "preview"}, **HX)

    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith("<form")
    assert "Estimated cost of the job" in html
    assert html.count('class="chosen"') == 1
    assert "RTX 4090" in html
    assert response.context["preview"].estimated_total_usd > 0
    assert Job.objects.count() == 0


def test_preview_without_js_renders_the_whole_page_with_offers(member_client, sandbox, settings):
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = "sandbox-key"

    response = member_client.post(reverse("job-new"), {**toy_form(), "action": "preview"})

    html = response.content.decode()
    assert "<html" in html
    assert "Estimated cost of the job" in html


def test_preview_says_clearly_when_the_marketplace_is_unreachable(member_client, settings):
    settings.VAST_URL = "http://127.0.0.1:9"

    response = member_client.post(reverse("job-new"), {**toy_form(), "action": "preview"}, **HX)

    assert response.status_code == 200
    assert "could not be asked for offers" in response.content.decode()


def test_preview_says_when_no_offer_matches(member_client, sandbox, settings):
    settings.VAST_URL = sandbox.url
    settings.VAST_API_KEY = "sandbox-key"

    response = member_client.post(
        reverse("job-new"), {**toy_form(gpu_names="No Such GPU"), "action": "preview"}, **HX
    )

    assert "No offer on the market matches" in response.content.decode()


# --- detail -----------------------------------------------------------------------------------


def test_job_page_shows_timeline_with_detection_and_recovery_times(member_client, cast):
    job, attempt = running_job(cast.team_a)
    detected = timezone.now() - timedelta(minutes=3)
    InterruptionFactory(
        attempt=attempt,
        cause="provider_gone",
        last_heartbeat_at=detected - timedelta(seconds=12),
        detected_at=detected,
        replacement_rented_at=detected + timedelta(seconds=20),
        running_again_at=detected + timedelta(seconds=95),
        training_again_at=detected + timedelta(seconds=120),
        resumed_step=100,
    )
    JobEventFactory(job=job, kind="host_lost", message="host lost", created_at=detected)

    html = member_client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert "host lost" in html
    assert "12 s after the last heartbeat" in html
    # Both figures from the loss (the last heartbeat): 107 s and 132 s.
    assert "<dt>Back on a machine</dt>" in html
    assert "after 1 min 47 s (" in html
    assert "resumed from step 100" in html
    assert "<dt>Training again</dt>" in html
    assert "after 2 min 12 s (" in html
    assert "step 120 loss 0.4321" in html  # log tail


GPU_ROWS = [
    {
        "index": 0,
        "pci_bus_id": "00000000:01:00.0",
        "name": "NVIDIA GeForce RTX 4090",
        "utilization_pct": 97.0,
        "memory_used_mib": 20123.0,
        "memory_total_mib": 24564.0,
        "temperature_c": 61.0,
        "ecc_uncorrected": None,
        "error": None,
    },
    {
        "index": 1,
        "pci_bus_id": "00000000:41:00.0",
        "name": "NVIDIA GeForce RTX 4090",
        "utilization_pct": None,
        "memory_used_mib": None,
        "memory_total_mib": None,
        "temperature_c": None,
        "ecc_uncorrected": None,
        "error": "lost: GPU is lost.  Reboot the system to recover this GPU",
    },
]


def test_job_page_shows_each_gpu_of_the_host_and_the_one_that_is_lost(member_client, cast):
    job, attempt = running_job(cast.team_a)
    attempt.gpus, attempt.gpu_ok = GPU_ROWS, False
    attempt.gpu_error = "GPU 1 (0000:41:00.0) is lost: GPU is lost."
    attempt.save()

    html = member_client.get(reverse("job-detail", args=[job.id]), **HX).content.decode()

    assert 'id="gpu-health"' in html
    assert (
        "<td>GPU 0</td><td><code>00000000:01:00.0</code></td><td>NVIDIA GeForce RTX 4090</td>"
        '<td class="num">97 %</td><td class="num">20,123 / 24,564 MiB</td>'
        '<td class="num">61 °C</td><td class="num">—</td><td>ok</td>'
    ) in html
    assert '<tr class="errorlist"><td>GPU 1</td>' in html
    assert "lost: GPU is lost.  Reboot the system to recover this GPU" in html
    assert "GPU 1 (0000:41:00.0) is lost: GPU is lost." in html  # the fault, above the table


def test_job_page_shows_no_gpu_table_before_a_heartbeat_lists_them(member_client, cast):
    job, _ = running_job(cast.team_a)

    html = member_client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert 'id="gpu-health"' not in html


def test_a_host_lost_after_waiting_shows_its_interruption_dated_when_it_went_offline(
    member_client, cast
):
    job, attempt = running_job(cast.team_a)
    went = timezone.now() - timedelta(minutes=10)
    InterruptionFactory(
        attempt=attempt, cause="provider_offline", detected_at=went,
        last_heartbeat_at=went - timedelta(seconds=4),
    )  # fmt: skip
    JobEventFactory(
        job=job, kind="host_lost", message="host lost (provider_offline)",
        created_at=went + timedelta(minutes=10), data={"attempt_id": attempt.pk},
    )  # fmt: skip

    html = member_client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert html.count("ev-host_lost") == 1  # one entry, with its interruption's details
    assert "4 s after the last heartbeat" in html


def test_job_page_with_htmx_answers_only_the_live_region(member_client, cast):
    job, _ = running_job(cast.team_a)

    html = member_client.get(reverse("job-detail", args=[job.id]), **HX).content.decode()

    assert html.lstrip().startswith('<div id="job-live"')
    assert 'hx-trigger="every 3s"' in html
    assert "<html" not in html


def test_a_finished_jobs_live_region_stops_polling(member_client, cast):
    job = JobFactory(team=cast.team_a, state="cancelled")

    html = member_client.get(reverse("job-detail", args=[job.id]), **HX).content.decode()

    assert "every 3s" not in html


def test_a_poll_refreshes_the_buttons_so_a_finished_job_loses_cancel(member_client, cast):
    job, _ = running_job(cast.team_a)
    url = reverse("job-detail", args=[job.id])
    live = member_client.get(url, **HX).content.decode()
    Job.objects.filter(pk=job.pk).update(state="succeeded")

    done = member_client.get(url, **HX).content.decode()

    assert 'id="job-actions" hx-swap-oob="true"' in live
    assert "Cancel job" in live
    assert 'id="job-actions" hx-swap-oob="true"' in done
    assert "Cancel job" not in done


def test_job_page_draws_loss_and_spend_charts(member_client, cast):
    job, _ = running_job(cast.team_a, created_at=timezone.now() - timedelta(minutes=11))
    for step, loss in [(0, 2.0), (30, 1.2), (60, 0.8)]:
        LossPointFactory(job=job, step=step, loss=loss)

    html = member_client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert html.count("<polyline") == 2
    assert "Training loss by step" in html


def test_job_page_explains_the_chosen_host_with_cost_breakdowns(member_client, cast):
    job, attempt = running_job(cast.team_a)
    offer = {
        "id": 7,
        "machine_id": 70,
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
        "dph_base": 0.3,
        "dph_total": 0.31,
        "inet_down_mbps": 900,
        "reliability": 0.99,
        "geolocation": "SE",
    }
    cost = {
        "gpu_usd": 0.1,
        "storage_usd": 0.01,
        "download_usd": 0.02,
        "upload_usd": 0.0,
        "total_usd": 0.13,
        "train_h": 0.3,
    }
    attempt.decision = {
        "chosen_offer_id": 7,
        "estimated_total_usd": 0.13,
        "chosen": {"offer": offer, "cost": cost},
        "candidates": [
            {"offer": offer, "cost": cost},
            {"offer": {**offer, "id": 8}, "cost": {**cost, "storage_usd": 0.08, "total_usd": 0.2}},
        ],
        "offers_seen": 240,
        "offers_ranked": 12,
        "offers_rejected": 228,
        "rejected_by_rule": {"gpu_name": 200, "reliability": 28},
    }
    attempt.save()

    html = member_client.get(reverse("job-detail", args=[job.id])).content.decode()

    assert "Chose offer 7" in html
    assert "12 acceptable of 240 offers seen" in html
    # Each row's total is the sum of its columns, written by the one money rule.
    assert f"<strong>{money(0.13)}</strong>" in html
    assert f"<strong>{money(0.2)}</strong>" in html


def test_resume_is_for_admins_and_for_members_once_no_limit_holds_the_job(client, cast):
    free = JobFactory(team=cast.team_a, state="paused_budget", total_steps=1000)
    held = JobFactory(
        team=cast.team_a, state="paused_budget", total_steps=1000, budget_usd=Decimal("0.001")
    )  # the rest of the run is estimated at more than its own limit

    def buttons(user, job) -> tuple[bool, bool]:
        client.force_login(user)
        html = client.get(reverse("job-detail", args=[job.id])).content.decode()
        return ">Resume</button>" in html, ">Ask to resume</button>" in html

    assert buttons(cast.admin, free) == (True, False)
    assert buttons(cast.admin, held) == (True, False)
    assert buttons(cast.member, free) == (True, False)  # billing.resume: it fits, as a submit
    assert buttons(cast.member, held) == (False, True)


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_without_confirmation_asks_first(member_client, cast):
    job, _ = running_job(cast.team_a)

    response = member_client.post(reverse("job-cancel", args=[job.id]))

    job.refresh_from_db()
    assert "Yes, cancel the job" in response.content.decode()
    assert job.state == "running"


def test_confirmed_cancel_stops_the_job_and_returns_to_its_page(member_client, cast):
    job, attempt = running_job(cast.team_a)

    response = member_client.post(reverse("job-cancel", args=[job.id]), {"confirm": "yes"})

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert response.status_code == 302
    assert response.url == reverse("job-detail", args=[job.id])
    assert job.state == "cancelled"
    assert attempt.state == "ended"


def test_cancel_with_htmx_redirects_the_client(member_client, cast):
    job, _ = running_job(cast.team_a)

    response = member_client.post(reverse("job-cancel", args=[job.id]), {"confirm": "yes"}, **HX)

    assert response["HX-Redirect"] == reverse("job-detail", args=[job.id])


def test_cancelling_a_finished_job_says_so(member_client, cast):
    job = JobFactory(team=cast.team_a, state="succeeded")

    response = member_client.post(
        reverse("job-cancel", args=[job.id]), {"confirm": "yes"}, follow=True
    )

    assert "had already finished" in response.content.decode()


# --- checkpoint download ----------------------------------------------------------------------


def ready_checkpoint(job, attempt, payload: bytes, *, encrypted: bool, settings, tmp_path):
    from agent.ckptcrypto import encrypt_stream
    from nomadgpu.storage import object_store

    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"
    body = payload
    if encrypted:
        out = io.BytesIO()
        encrypt_stream(io.BytesIO(payload), out, base64.b64decode(job.data_key))
        body = out.getvalue()
    key = f"{attempt.storage_prefix}checkpoints/50/checkpoint.tar"
    object_store(job.team).put_bytes(key, body)
    return CheckpointFactory(
        attempt=attempt,
        step=50,
        state="ready",
        key=key,
        size=len(body),
        encrypted=encrypted,
    )


def test_checkpoint_download_streams_the_object(member_client, cast, settings, tmp_path):
    job, attempt = running_job(cast.team_a)
    payload = b"tar-bytes" * 100_000
    ckpt = ready_checkpoint(
        job, attempt, payload, encrypted=False, settings=settings, tmp_path=tmp_path
    )

    response = member_client.get(reverse("checkpoint-download", args=[job.id, ckpt.id]))

    assert response.streaming
    assert b"".join(response.streaming_content) == payload
    assert "attachment" in response["Content-Disposition"]


def test_encrypted_checkpoint_is_decrypted_on_download(member_client, cast, settings, tmp_path):
    from nomadgpu.crypto import new_data_key

    job, attempt = running_job(cast.team_a, encrypt_checkpoints=True, data_key=new_data_key())
    payload = bytes(range(256)) * 40_000  # ~10 MB: several 4 MiB chunks
    ckpt = ready_checkpoint(
        job, attempt, payload, encrypted=True, settings=settings, tmp_path=tmp_path
    )

    response = member_client.get(reverse("checkpoint-download", args=[job.id, ckpt.id]))

    assert response.streaming
    assert b"".join(response.streaming_content) == payload


def test_a_checkpoint_not_ready_is_404(member_client, cast):
    job, attempt = running_job(cast.team_a)
    ckpt = CheckpointFactory(attempt=attempt, step=50, state="uploading")

    response = member_client.get(reverse("checkpoint-download", args=[job.id, ckpt.id]))

    assert response.status_code == 404


def test_a_budget_refusal_at_submit_is_shown_on_the_form(member_client):
    # The toy is estimated at $0.0079 on the reference host (its 300 steps of 0.2 s).
    response = member_client.post(reverse("job-new"), toy_form(budget_usd="0.005"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "would cross" in html
    assert "job limit $0.005" in html
    assert Job.objects.count() == 0


def test_the_team_switcher_changes_the_team_shown(client, cast):
    MembershipFactory(user=cast.member, team=cast.team_b, role="member")
    JobFactory(team=cast.team_a, name="team-a-job")
    JobFactory(team=cast.team_b, name="team-b-job")
    client.force_login(cast.member)

    switched = client.get(reverse("dashboard") + "?team=team-b").content.decode()
    listed = client.get(reverse("job-list")).content.decode()

    assert 'id="team-switch"' in switched
    assert "team-b-job" in switched
    assert "team-b-job" in listed
    assert "team-a-job" not in listed
