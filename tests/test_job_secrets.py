"""A job names team secrets and a setup: a name the team lacks is refused at submit (member
API 422, the form's error), the job's own agent gets the values in its register reply and no
other agent does, and the values never come back out: masked in the log tail the server keeps
(exit) and shows (job page, member API, admin), with nothing added to the heartbeat."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job, JobEvent
from nomadgpu import api_tokens
from tests.support.factories import JobFactory, TeamSecretFactory, make_attempt

pytestmark = pytest.mark.django_db

HF_TOKEN = "hf_live_0123456789abcdefSECRET"
THEIR_TOKEN = "hf_live_team_b_9999OTHER"
SETUP = "pip install -r requirements.txt"
SPEC = {
    "name": "sft-own-code",
    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    "command": "python train.py",
    "total_steps": 300,
    "setup": SETUP,
}


@pytest.fixture(autouse=True)
def no_worker(monkeypatch):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)


@pytest.fixture
def hf_token(cast):
    return TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)


def bearer(user) -> dict[str, str]:
    _, token = api_tokens.create_token(user=user, name="test", now=timezone.now())
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def submit(client, user, **spec):
    body = {**SPEC, "team": "team-a", **spec}
    return client.post("/api/jobs/", body, content_type="application/json", **bearer(user))


def agent_call(client, token: str, name: str, body: dict):
    return client.post(
        f"/api/agent/{name}",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def beat(seq: int, **extra) -> dict:
    return {"seq": seq, "phase": "running", "step": seq, "gpu": {"ok": True}, **extra}


# ---- submit -----------------------------------------------------------------------------------


def test_the_member_api_refuses_a_secret_the_team_does_not_have_naming_it(client, cast, hf_token):
    response = submit(client, cast.member, secrets=["HF_TOKEN", "WANDB_API_KEY"])

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "payload", "secrets"]
    assert error["msg"] == (
        "the team has no secret named 'WANDB_API_KEY': add it on the Team page or in the admin"
    )
    assert not Job.objects.exists()


def test_the_member_api_refuses_a_registry_login_secret_the_team_does_not_have(client, cast):
    response = submit(client, cast.member, image_login_secret="GHCR_LOGIN")

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "payload", "image_login_secret"]
    assert "no secret named 'GHCR_LOGIN'" in error["msg"]


def test_another_teams_secret_of_that_name_does_not_count(client, cast):
    TeamSecretFactory(team=cast.team_b, name="HF_TOKEN", value=THEIR_TOKEN)

    response = submit(client, cast.member, secrets=["HF_TOKEN"])

    assert response.status_code == 422


def test_a_job_naming_the_teams_secrets_is_stored_with_names_only(client, cast, hf_token):
    response = submit(client, cast.member, secrets=["HF_TOKEN"])

    assert response.status_code == 201, response.content.decode()
    job = Job.objects.get()
    assert (job.secrets, job.setup) == (["HF_TOKEN"], SETUP)
    assert HF_TOKEN not in response.content.decode()
    assert HF_TOKEN not in json.dumps(list(JobEvent.objects.values("message", "data")))


def test_a_secret_that_is_also_in_env_is_refused(client, cast, hf_token):
    response = submit(client, cast.member, secrets=["HF_TOKEN"], env={"HF_TOKEN": "plain"})

    assert response.status_code == 422
    assert "'HF_TOKEN' is in env and in secrets" in response.content.decode()


def form_post(client, **fields):
    data = {"team": "team-a", "action": "submit", "name": "form-job", "total_steps": "300"}
    data |= {"image": SPEC["image"], "command": SPEC["command"], "verified_only": "on", **fields}
    return client.post(reverse("job-new"), data)


def test_the_form_offers_the_teams_secret_names_and_never_a_value(client, cast, hf_token):
    client.force_login(cast.member)

    html = client.get(reverse("job-new")).content.decode()

    assert 'name="setup"' in html
    assert 'name="secrets" value="HF_TOKEN"' in html
    assert '<option value="HF_TOKEN">HF_TOKEN</option>' in html  # the registry login picker
    assert HF_TOKEN not in html


def test_the_form_refuses_a_missing_secret_under_its_field(client, cast, hf_token):
    client.force_login(cast.member)

    response = form_post(client, secrets=["HF_TOKEN", "WANDB_API_KEY"], setup=SETUP)

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert errors["secrets"] == [
        "the team has no secret named 'WANDB_API_KEY': add it on the Team page or in the admin"
    ]
    assert not Job.objects.exists()


def test_the_form_submits_setup_and_secrets(client, cast, hf_token):
    client.force_login(cast.member)

    response = form_post(client, secrets=["HF_TOKEN"], setup=SETUP)

    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert (job.secrets, job.setup, job.image_login_secret) == (["HF_TOKEN"], SETUP, "")


# ---- register ---------------------------------------------------------------------------------


def test_register_gives_the_jobs_agent_its_setup_and_secret_values(client, cast, hf_token):
    job = JobFactory(team=cast.team_a, setup=SETUP, secrets=["HF_TOKEN"])
    _, token = make_attempt(job)

    body = agent_call(client, token, "register", {"agent_version": "1"}).json()

    assert body["setup"] == SETUP
    assert body["secrets"] == {"HF_TOKEN": HF_TOKEN}
    assert HF_TOKEN not in json.dumps(body["env"])


def test_another_teams_agent_gets_none_of_the_values(client, cast, hf_token):
    TeamSecretFactory(team=cast.team_b, name="HF_TOKEN", value=THEIR_TOKEN)
    theirs = JobFactory(team=cast.team_b, secrets=["HF_TOKEN"])
    plain = JobFactory(team=cast.team_b)
    # A job whose team has since lost the secret (deleted after the submit) gets nothing.
    orphan = JobFactory(team=cast.team_b, secrets=["WANDB_API_KEY"])
    replies = {}
    for job in (theirs, plain, orphan):
        _, token = make_attempt(job)
        replies[job.pk] = agent_call(client, token, "register", {"agent_version": "1"}).json()

    assert replies[theirs.pk]["secrets"] == {"HF_TOKEN": THEIR_TOKEN}
    assert replies[plain.pk]["secrets"] == {}
    assert replies[orphan.pk]["secrets"] == {}
    assert HF_TOKEN not in json.dumps(replies)


# ---- masking ----------------------------------------------------------------------------------


def test_the_log_tail_kept_at_exit_and_its_event_are_masked(client, cast, hf_token):
    job = JobFactory(team=cast.team_a, secrets=["HF_TOKEN"])
    attempt, token = make_attempt(job, state="running", instance_id=1)
    leaked = f"Traceback: bad token {HF_TOKEN}\nRuntimeError"

    agent_call(client, token, "exit", {"reason": "failed", "exit_code": 1, "log_tail": leaked})

    attempt.refresh_from_db()
    assert attempt.log_tail == "Traceback: bad token ***\nRuntimeError"
    failed = JobEvent.objects.get(job=job, kind="failed")
    assert HF_TOKEN not in json.dumps(failed.data)


def test_a_leaked_value_in_a_heartbeat_is_masked_on_the_page_in_the_api_and_the_admin(
    client, cast, hf_token
):
    job = JobFactory(team=cast.team_a, secrets=["HF_TOKEN"])
    attempt, token = make_attempt(job, state="running", instance_id=1)
    agent_call(client, token, "heartbeat", beat(1, log_tail=f"login with {HF_TOKEN}\nstep 1"))

    client.force_login(cast.admin)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    logs = client.get(f"/api/jobs/{job.pk}/logs").content.decode()
    admin = client.get(reverse("admin:jobs_attempt_change", args=[attempt.pk])).content.decode()

    for shown in (page, logs, admin):
        assert HF_TOKEN not in shown
    assert "Secrets in the command's environment: <code>HF_TOKEN</code>" in page
    assert "login with ***" in page
    assert "login with ***" in logs
    assert "login with ***" in admin


def test_the_registry_logins_password_is_masked_on_its_own_too(client, cast):
    TeamSecretFactory(team=cast.team_a, name="GHCR", value="-u bot -p ghp_pullTOKEN42 ghcr.io")
    job = JobFactory(team=cast.team_a, image_login_secret="GHCR")
    attempt, token = make_attempt(job, state="running", instance_id=1)

    agent_call(
        client, token, "exit", {"reason": "failed", "exit_code": 1, "log_tail": "ghp_pullTOKEN42"}
    )

    attempt.refresh_from_db()
    assert attempt.log_tail == "***"


def test_the_heartbeat_costs_the_same_queries_with_secrets_and_never_reads_them(client, cast):
    TeamSecretFactory(team=cast.team_a, name="HF_TOKEN", value=HF_TOKEN)
    counts = []
    for secrets in ([], ["HF_TOKEN"]):
        _, token = make_attempt(JobFactory(team=cast.team_a, secrets=secrets), state="running")
        agent_call(client, token, "heartbeat", beat(1))  # the first beat may sample a loss
        with CaptureQueriesContext(connection) as queries:
            agent_call(client, token, "heartbeat", beat(2, log_tail=f"x {HF_TOKEN}"))
        counts.append(len(queries))
        assert not any("teamsecret" in q["sql"].lower() for q in queries.captured_queries)

    assert counts[0] == counts[1]
