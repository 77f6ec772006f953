"""The job's admin page: an edit passes the same ``JobSpec`` as every other way in (a bad
``requirements``, ``profile`` or ``env`` is a form error naming the field, and nothing is
saved), the state is read-only (``jobs.lifecycle`` moves it) and jobs are not added here."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from jobs.models import Job, JobState
from jobs.spec import JobSpec
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, cast):
    client.force_login(cast.admin)
    return client


@pytest.fixture
def job(cast):
    return JobFactory(
        team=cast.team_a,
        state=JobState.RUNNING,
        requirements={"gpu_names": ["RTX 4090"], "disk_gb": 20.0},
        env={"LR": "2e-4"},
    )


def change_url(job) -> str:
    return reverse("admin:jobs_job_change", args=[job.pk])


def form_data(client, job) -> dict:
    """The change form as the page fills it in (what a person submits without touching it)."""
    page = client.get(change_url(job))
    form = page.context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()  # as the widget renders it (JSON as text)
        if value is not None:
            data[name] = value
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data |= {management[k].html_name: management[k].value() for k in management.fields}
    return data


def post(client, job, **changes):
    data = form_data(client, job)
    for name, value in changes.items():
        data[name] = json.dumps(value) if isinstance(value, dict) else value
    return client.post(change_url(job), data)


def errors_of(response) -> dict[str, list[str]]:
    assert response.status_code == 200, "the form was accepted"
    return response.context["adminform"].form.errors


def test_a_typod_requirements_key_is_refused_under_its_field_and_nothing_is_saved(
    admin_client, job
):
    response = post(
        admin_client, job, requirements={"gpu_name": ["RTX 4090"]}, name="renamed-by-mistake"
    )

    assert errors_of(response)["requirements"] == ["requirements: unknown key 'gpu_name'"]
    job.refresh_from_db()
    assert job.requirements == {"gpu_names": ["RTX 4090"], "disk_gb": 20.0}
    assert job.name != "renamed-by-mistake"


def test_a_profile_value_out_of_range_is_refused_under_its_field(admin_client, job):
    response = post(admin_client, job, profile={"image_gb": -1})

    [error] = errors_of(response)["profile"]
    assert error.startswith("profile.image_gb: Input should be greater than or equal to 0")
    job.refresh_from_db()
    assert job.profile == {}


def test_an_env_name_the_agent_owns_is_refused_under_env(admin_client, job):
    response = post(admin_client, job, env={"NOMAD_TOKEN": "x"})

    [error] = errors_of(response)["env"]
    assert error.startswith("env: ")
    assert "NOMAD_* variables are set by the agent" in error
    job.refresh_from_db()
    assert job.env == {"LR": "2e-4"}


def test_a_valid_edit_is_saved_as_the_spec_normalises_it(admin_client, job):
    response = post(admin_client, job, requirements={"gpu_names": ["A100"], "num_gpus": 2})

    assert response.status_code == 302, response.content.decode()[-3000:]
    job.refresh_from_db()
    expected = JobSpec(
        name="x", image="i", command="c", requirements={"gpu_names": ["A100"], "num_gpus": 2}
    ).requirements.model_dump()
    assert job.requirements == expected  # the spec's defaults filled in, as a submit stores
    assert job.requirements["min_reliability"] == 0.98


def test_the_state_is_shown_read_only_and_a_posted_state_changes_nothing(admin_client, job):
    html = admin_client.get(change_url(job)).content.decode()
    response = post(admin_client, job, state=JobState.SUCCEEDED)

    assert 'name="state"' not in html
    assert '<div class="readonly">Running</div>' in html
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_jobs_are_not_added_in_the_admin(admin_client):
    assert admin_client.get(reverse("admin:jobs_job_add")).status_code == 403
    assert not Job.objects.exists()


def test_a_job_held_for_attention_is_queued_again_once_saved_fixed(
    admin_client, job, django_capture_on_commit_callbacks
):
    # Hand-edited before this form validated: the rent loop held it (jobs.attention).
    Job.objects.filter(pk=job.pk).update(
        state=JobState.NEEDS_ATTENTION, requirements={"gpu_name": ["RTX 4090"]}
    )

    with django_capture_on_commit_callbacks(execute=True):
        response = post(admin_client, job, requirements={"gpu_names": ["RTX 4090"]})

    assert response.status_code == 302, response.content.decode()[-3000:]
    job.refresh_from_db()
    assert job.state == JobState.RENTING  # queued, and its rent planned after the commit
    assert job.attempts.count() == 1
    assert job.events.get(kind="fixed").message.startswith("fixed by alice (admin)")


def test_the_change_page_of_a_job_whose_stored_spec_is_broken_opens_to_be_fixed(admin_client, job):
    Job.objects.filter(pk=job.pk).update(
        state=JobState.NEEDS_ATTENTION, requirements={"gpu_name": ["RTX 4090"]}
    )

    response = admin_client.get(change_url(job))

    assert response.status_code == 200
    assert "the job&#x27;s stored spec does not validate" in response.content.decode()


def test_a_launcher_set_in_the_admin_is_checked_against_the_command_like_a_submit(
    admin_client, job
):
    refused = post(admin_client, job, launcher="torchrun", command="torchrun train.py")

    [error] = errors_of(refused)["__all__"]
    assert "command already starts torchrun, and launcher is set too" in error
    job.refresh_from_db()
    assert job.launcher is None

    taken = post(admin_client, job, launcher="torchrun", command="python train.py")
    assert taken.status_code == 302, taken.content.decode()[-3000:]
    job.refresh_from_db()
    assert job.launcher == "torchrun"
    cleared = post(admin_client, job, launcher="")
    assert cleared.status_code == 302
    job.refresh_from_db()
    assert job.launcher is None  # the spec's "none", not an empty text
