"""The job's ``race`` key ("auto", "off" or N instances at once) through every way a job comes
in: the member API, the CLI's job file, the portal's form and the admin; "auto" by default."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.job_templates import template_spec
from jobs.models import Job
from jobs.spec import JobSpec, ValidationError
from nomadgpu import api_tokens
from nomadgpu_cli import cli
from portal.forms import spec_to_initial
from tests.support.factories import JobFactory

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


@pytest.mark.parametrize(
    ("given", "stored"), [(None, "auto"), ("auto", "auto"), ("OFF", "off"), (3, "3"), ("2", "2")]
)
def test_the_spec_takes_auto_off_or_a_number_and_auto_by_default(given, stored):
    fields = {} if given is None else {"race": given}

    assert str(JobSpec(**SPEC, **fields).job_fields()["race"]) == stored


@pytest.mark.parametrize("given", [0, 5, "fast", True, 2.5])
def test_anything_else_is_refused_saying_what_it_takes(given):
    with pytest.raises(ValidationError) as caught:
        JobSpec(**SPEC, race=given)

    assert '"auto", "off" or a number of instances from 1 to 4' in str(caught.value)


@pytest.mark.django_db
def test_the_member_api_stores_it_and_refuses_a_bad_one_under_its_key(client, cast):
    accepted = client.post(
        "/api/jobs/", {**SPEC, "race": 2}, content_type="application/json", **bearer(cast.member)
    )
    refused = client.post(
        "/api/jobs/", {**SPEC, "race": 9}, content_type="application/json", **bearer(cast.member)
    )

    assert accepted.status_code == 201, accepted.content
    assert Job.objects.get(pk=accepted.json()["id"]).race == "2"
    assert refused.status_code == 422
    assert "race" in str(refused.json()["detail"])


@pytest.mark.django_db(transaction=True)
def test_the_clis_job_file_carries_it(live_server, cast, tmp_path, capsys):
    token = api_tokens.create_token(user=cast.member, name="cli", now=timezone.now())[1]
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'name = "raced"\nimage = "img"\ncommand = "python train.py"\nrace = "off"\n'
        '[requirements]\ngpu_names = ["RTX 4090"]\n'
    )

    code = cli.main(["--url", live_server.url, "--token", token, "submit", str(job_file)])

    assert code == 0, capsys.readouterr()
    assert Job.objects.get(name="raced").race == "off"


@pytest.fixture
def member_client(client, cast):
    client.force_login(cast.member)
    return client


def toy_form(**overrides):
    data = {**spec_to_initial(template_spec("toy")), "team": "team-a", **overrides}
    data["verified_only"] = "on"
    return data


@pytest.mark.django_db
def test_the_form_offers_it_under_rental_and_stores_the_choice(member_client):
    page = member_client.get(reverse("job-new")).content.decode()
    member_client.post(reverse("job-new"), toy_form(race="3"))

    assert "Hedged rents" in page
    assert '<option value="auto" selected>auto</option>' in page
    assert Job.objects.get().race == "3"


@pytest.mark.django_db
def test_the_admin_edits_it_through_the_spec(client, cast):
    client.force_login(cast.admin)
    job = JobFactory(team=cast.team_a, race="auto", requirements={"gpu_names": ["RTX 4090"]})
    url = reverse("admin:jobs_job_change", args=[job.pk])
    page = client.get(url)
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data |= {management[k].html_name: management[k].value() for k in management.fields}

    refused = client.post(url, {**data, "race": "seven"})
    saved = client.post(url, {**data, "race": "2"})

    assert "race" in refused.context["adminform"].form.errors
    assert saved.status_code == 302
    job.refresh_from_db()
    assert job.race == "2"
