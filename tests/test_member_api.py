"""The member API through its real URLs: personal tokens, team scoping, validation, cursors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Job, JobEvent
from nomadgpu import api_tokens
from nomadgpu.models import ApiToken, Role
from tests.support.factories import JobFactory, MembershipFactory, make_attempt

pytestmark = pytest.mark.django_db

SPEC = {
    "name": "sft-7b",
    "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
    "command": "python train.py",
    "total_steps": 300,
    "requirements": {"gpu_names": ["RTX 4090"]},
}


def bearer(user) -> dict[str, str]:
    _, token = api_tokens.create_token(user=user, name="test", now=timezone.now())
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def post(client, url, data=None, **headers):
    return client.post(url, data or {}, content_type="application/json", **headers)


# ---- tokens -----------------------------------------------------------------------------------


def test_it_stores_only_a_digest_of_the_token(cast):
    row, token = api_tokens.create_token(user=cast.member, name="laptop", now=timezone.now())

    assert token.startswith("ngpt_")
    assert token not in {row.prefix, row.digest}
    assert token[5:] not in ApiToken.objects.values_list("digest", flat=True)


def test_it_lists_jobs_with_a_personal_token(client, cast):
    JobFactory(team=cast.team_a, name="ours")

    response = client.get("/api/jobs/", **bearer(cast.member))

    assert response.status_code == 200
    assert [j["name"] for j in response.json()] == ["ours"]


def test_it_rejects_requests_without_a_token_or_with_a_wrong_one(client, cast):
    headers = bearer(cast.member)
    wrong = headers["HTTP_AUTHORIZATION"][:-4] + "AAAA"

    assert client.get("/api/jobs/").status_code == 401
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION=wrong).status_code == 401


def test_a_revoked_token_is_401(client, cast):
    row, token = api_tokens.create_token(user=cast.member, name="old", now=timezone.now())
    api_tokens.revoke_token(user=cast.member, token_id=row.pk, now=timezone.now())

    response = client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert response.status_code == 401


def test_a_token_of_a_deactivated_user_is_401(client, cast):
    headers = bearer(cast.member)
    cast.member.is_active = False
    cast.member.save()

    assert client.get("/api/jobs/", **headers).status_code == 401


def test_using_a_token_records_when(client, cast):
    row, token = api_tokens.create_token(user=cast.member, name="ci", now=timezone.now())

    client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}")

    row.refresh_from_db()
    assert row.last_used_at is not None


def test_the_browser_session_also_authenticates(client, cast):
    JobFactory(team=cast.team_a, name="ours")
    client.force_login(cast.member)

    assert [j["name"] for j in client.get("/api/jobs/").json()] == ["ours"]


# ---- team scoping -----------------------------------------------------------------------------


def test_an_outsider_gets_404_for_every_endpoint_of_another_teams_job(client, cast):
    job = JobFactory(team=cast.team_a)
    headers = bearer(cast.outsider)

    for url in ("", "/events", "/logs"):
        assert client.get(f"/api/jobs/{job.pk}{url}", **headers).status_code == 404
    for url in ("/cancel", "/drill"):
        assert post(client, f"/api/jobs/{job.pk}{url}", **headers).status_code == 404
    job.refresh_from_db()
    assert job.state == "queued"


def test_the_list_never_shows_another_teams_jobs(client, cast):
    JobFactory(team=cast.team_a, name="ours")
    JobFactory(team=cast.team_b, name="theirs")

    names = [j["name"] for j in client.get("/api/jobs/", **bearer(cast.outsider)).json()]
    filtered = client.get("/api/jobs/?team=team-a", **bearer(cast.outsider)).json()

    assert names == ["theirs"]
    assert filtered == []


def test_the_list_filters_by_team_and_state(client, cast):
    MembershipFactory(team=cast.team_b, user=cast.member)
    JobFactory(team=cast.team_a, name="a-queued")
    JobFactory(team=cast.team_a, name="a-done", state="succeeded")
    JobFactory(team=cast.team_b, name="b-queued")
    headers = bearer(cast.member)

    def names(query: str) -> set[str]:
        return {j["name"] for j in client.get(f"/api/jobs/{query}", **headers).json()}

    assert names("") == {"a-queued", "a-done", "b-queued"}
    assert names("?team=team-a") == {"a-queued", "a-done"}
    assert names("?state=queued") == {"a-queued", "b-queued"}
    assert names("?team=team-a&state=succeeded,failed") == {"a-done"}


# ---- submit -----------------------------------------------------------------------------------


def test_submit_queues_the_job_in_the_members_only_team(client, cast):
    response = post(client, "/api/jobs/", SPEC, **bearer(cast.member))

    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert (job.team, job.created_by, job.name) == (cast.team_a, cast.member, "sft-7b")
    assert job.requirements["gpu_names"] == ["RTX 4090"]
    assert body["team"] == "team-a"
    assert body["state"] == "queued"
    assert body["total_steps"] == 300


def test_a_member_of_two_teams_must_say_which(client, cast):
    MembershipFactory(team=cast.team_b, user=cast.member)
    headers = bearer(cast.member)

    refused = post(client, "/api/jobs/", SPEC, **headers)
    accepted = post(client, "/api/jobs/", {**SPEC, "team": "team-b"}, **headers)

    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert error["loc"][-1] == "team"
    assert "team-a, team-b" in error["msg"]
    assert accepted.status_code == 201
    assert Job.objects.get().team == cast.team_b


def test_a_job_whose_estimate_crosses_its_budget_is_refused_with_409(client, cast):
    response = post(client, "/api/jobs/", {**SPEC, "budget_usd": "0.01"}, **bearer(cast.member))

    assert response.status_code == 409
    assert "job limit $0.01" in response.json()["detail"]
    assert not Job.objects.exists()


def test_submitting_to_a_team_one_is_not_in_is_404(client, cast):
    response = post(client, "/api/jobs/", {**SPEC, "team": "team-b"}, **bearer(cast.member))

    assert response.status_code == 404
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"requirements": {"num_gpus": 0}}, ["requirements", "num_gpus"]),
        ({"image": "has space"}, ["image"]),
        ({"requirements": {"min_reliabilty": 0.5}}, ["requirements", "min_reliabilty"]),
        ({"env": {"NOMAD_TOKEN": "x"}}, ["env"]),
    ],
)
def test_an_invalid_spec_is_422_naming_the_field(client, cast, change, where):
    response = post(client, "/api/jobs/", {**SPEC, **change}, **bearer(cast.member))

    assert response.status_code == 422
    locations = [e["loc"][2:] for e in response.json()["detail"]]
    assert where in locations
    assert not Job.objects.exists()


def test_a_missing_field_is_named(client, cast):
    spec = {k: v for k, v in SPEC.items() if k != "command"}

    response = post(client, "/api/jobs/", spec, **bearer(cast.member))

    assert response.status_code == 422
    assert ["body", "payload", "command"] in [e["loc"] for e in response.json()["detail"]]


# ---- show, cancel -----------------------------------------------------------------------------


def test_show_reports_progress_eta_spend_host_and_interruptions(client, cast):
    now = timezone.now()
    job = JobFactory(team=cast.team_a, total_steps=300)
    lost, _ = make_attempt(job, number=1, state="ended", instance_id=11, gpu_name="RTX 4090")
    make_attempt(
        job,
        number=2,
        state="running",
        instance_id=12,
        machine_id=77,
        gpu_name="RTX 4090",
        dph_base=0.36,
        rented_at=now - timedelta(hours=1),
        registered_at=now - timedelta(hours=1),
        step=150,
        total_steps=300,
        seconds_per_step=4.0,
        gpu_ok=True,
        gpus=[{"index": 0, "pci_bus_id": "00000000:01:00.0", "utilization_pct": 97.0}],
    )
    job.state = "running"
    job.save()
    job.interruptions.create(attempt=lost, cause="provider_gone", detected_at=now, resumed_step=100)

    body = client.get(f"/api/jobs/{job.pk}", **bearer(cast.member)).json()

    assert (body["step"], body["total_steps"], body["progress"]) == (150, 300, 0.5)
    assert body["eta_s"] == 600.0
    assert body["spend_usd"] == pytest.approx(0.36, rel=0.01)
    assert body["host"]["instance_id"] == 12
    assert body["host"]["machine_id"] == 77
    assert (body["host"]["gpu_ok"], body["host"]["gpu_error"]) == (True, "")
    assert body["host"]["gpus"] == [  # what an older row lacks is null
        {
            "index": 0,
            "pci_bus_id": "00000000:01:00.0",
            "name": "",
            "utilization_pct": 97.0,
            "memory_used_mib": None,
            "memory_total_mib": None,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "error": None,
        }
    ]
    assert body["interruptions"] == 1
    assert body["interruption_list"][0]["attempt"] == 1
    assert body["interruption_list"][0]["resumed_step"] == 100


def test_cancel_stops_the_job_and_a_second_cancel_is_409(client, cast):
    job = JobFactory(team=cast.team_a)
    headers = bearer(cast.member)

    first = post(client, f"/api/jobs/{job.pk}/cancel", **headers)
    second = post(client, f"/api/jobs/{job.pk}/cancel", **headers)

    assert first.status_code == 200
    assert first.json()["state"] == "cancelled"
    assert second.status_code == 409
    assert "cancelled" in second.json()["detail"]


# ---- cursors ----------------------------------------------------------------------------------


def test_events_after_a_cursor_are_only_the_newer_ones(client, cast):
    job = JobFactory(team=cast.team_a)
    now = timezone.now()
    for kind in ("submitted", "renting", "rented"):
        lifecycle.record_event(job.pk, now=now, kind=kind)
    headers = bearer(cast.member)

    everything = client.get(f"/api/jobs/{job.pk}/events", **headers).json()
    nothing_new = client.get(
        f"/api/jobs/{job.pk}/events?after={everything['cursor']}", **headers
    ).json()
    lifecycle.record_event(job.pk, now=now, kind="running")
    newer = client.get(f"/api/jobs/{job.pk}/events?after={everything['cursor']}", **headers).json()

    assert [e["kind"] for e in everything["events"]] == ["submitted", "renting", "rented"]
    assert everything["cursor"] == JobEvent.objects.filter(kind="rented").get().pk
    assert nothing_new == {**everything, "events": []}
    assert [e["kind"] for e in newer["events"]] == ["running"]
    assert newer["cursor"] > everything["cursor"]


def _tail(attempt, *lines: str) -> None:
    attempt.log_tail = "\n".join(lines)
    attempt.save(update_fields=["log_tail"])


def test_logs_follow_with_a_cursor_and_hold_back_the_line_still_being_written(client, cast):
    job = JobFactory(team=cast.team_a)
    attempt, _ = make_attempt(job, state="running")
    headers = bearer(cast.member)
    url = f"/api/jobs/{job.pk}/logs"
    _tail(attempt, "step 1", "step 2", "step 3 (partial")

    first = client.get(url, **headers).json()
    _tail(attempt, "step 2", "step 3", "step 4", "step 5")
    second = client.get(f"{url}?cursor={first['cursor']}", **headers).json()
    third = client.get(f"{url}?cursor={second['cursor']}", **headers).json()

    assert [line["text"] for line in first["lines"]] == ["step 1", "step 2"]
    assert first["pending"] == "step 3 (partial"
    assert [line["text"] for line in second["lines"]] == ["step 3", "step 4"]
    assert second["gap"] is False
    assert third["lines"] == []
    assert third["pending"] == "step 5"


def test_logs_report_a_gap_when_the_tail_rolled_past_the_cursor(client, cast):
    job = JobFactory(team=cast.team_a)
    attempt, _ = make_attempt(job, state="running")
    headers = bearer(cast.member)
    url = f"/api/jobs/{job.pk}/logs"
    _tail(attempt, "a", "b", "c", "d")
    cursor = client.get(url, **headers).json()["cursor"]
    _tail(attempt, "x", "y", "z", "now")

    after = client.get(f"{url}?cursor={cursor}", **headers).json()

    assert after["gap"] is True
    assert [line["text"] for line in after["lines"]] == ["x", "y", "z"]


def test_logs_follow_across_a_host_change(client, cast):
    job = JobFactory(team=cast.team_a)
    first, _ = make_attempt(job, number=1, state="running")
    headers = bearer(cast.member)
    url = f"/api/jobs/{job.pk}/logs"
    _tail(first, "step 1", "step 2", "step 3")
    cursor = client.get(url, **headers).json()["cursor"]
    _tail(first, "step 1", "step 2", "step 3", "step 4")
    first.state = "ended"
    first.save()
    second, _ = make_attempt(job, number=2, state="running")
    _tail(second, "resumed from step 0", "step 1", "live")

    after = client.get(f"{url}?cursor={cursor}", **headers).json()

    # step 3 was still being written at the first call; the ended attempt's lines are all settled
    assert [(line["attempt"], line["text"]) for line in after["lines"]] == [
        (1, "step 3"),
        (1, "step 4"),
        (2, "resumed from step 0"),
        (2, "step 1"),
    ]


def test_a_forged_log_cursor_is_422(client, cast):
    job = JobFactory(team=cast.team_a)

    response = client.get(f"/api/jobs/{job.pk}/logs?cursor=nonsense", **bearer(cast.member))

    assert response.status_code == 422


# ---- drill ------------------------------------------------------------------------------------


def test_only_a_team_admin_may_drill(client, cast):
    job = JobFactory(team=cast.team_a)
    make_attempt(job, state="running", instance_id=4242)

    response = post(client, f"/api/jobs/{job.pk}/drill", **bearer(cast.member))

    assert response.status_code == 403


def test_a_drill_without_a_running_host_is_409(client, cast):
    job = JobFactory(team=cast.team_a)
    assert cast.admin.memberships.get().role == Role.ADMIN

    response = post(client, f"/api/jobs/{job.pk}/drill", **bearer(cast.admin))

    assert response.status_code == 409
    assert "no running host" in response.json()["detail"]


# ---- docs -------------------------------------------------------------------------------------


def test_the_openapi_docs_list_the_member_endpoints_with_schemas(client):
    schema = client.get("/api/openapi.json").json()
    page = client.get("/api/docs")

    assert page.status_code == 200
    assert "swagger-ui" in page.content.decode()
    assert "cdn." not in page.content.decode()  # served from our static files: works offline
    for path in ("/api/jobs/", "/api/jobs/{job_id}", "/api/jobs/{job_id}/events"):
        assert path in schema["paths"]
    body = schema["paths"]["/api/jobs/"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("/SubmitIn")
    submit_in = schema["components"]["schemas"]["SubmitIn"]
    assert {"team", "image", "command", "requirements"} <= set(submit_in["properties"])
    assert "JobDetailOut" in schema["components"]["schemas"]
