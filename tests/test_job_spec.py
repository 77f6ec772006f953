"""The job spec shared by the CLI's TOML, the member API and the portal form (jobs/spec.py)."""

from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.spec import JobSpec, ValidationError, error_messages, submit_spec


def test_a_heartbeat_interval_may_be_a_fraction_of_a_second_down_to_a_fifth():
    base = {"name": "j", "image": "img:1", "command": "python train.py"}

    assert JobSpec.model_validate({**base, "heartbeat_interval_s": 0.5}).heartbeat_interval_s == 0.5
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**base, "heartbeat_interval_s": 0.1})


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"requirements": {"min_reliabilty": 0.5}}, "requirements.min_reliabilty"),
        ({"requirements": {"min_reliability": 1.5}}, "requirements.min_reliability"),
        ({"env": {"NOMAD_TOKEN": "x"}}, "env"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"image": "has space"}, "image"),
        ({"budget_usd": "-1"}, "budget_usd"),
    ],
)
def test_bad_input_names_the_field(data, where):
    base = {"name": "j", "image": "img:1", "command": "python train.py"}
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**base, **data})

    assert where in error_messages(exc.value)


@pytest.mark.django_db
def test_submit_spec_queues_the_job(cast, django_capture_on_commit_callbacks):
    spec = JobSpec.model_validate(
        {"name": "j", "image": "img:1", "command": "python t.py", "budget_usd": "12.50"}
    )
    with django_capture_on_commit_callbacks():
        job = submit_spec(spec, team=cast.team_a, created_by=cast.member, now=timezone.now())

    job.refresh_from_db()
    assert job.state in ("queued", "renting")
    assert job.budget_usd == Decimal("12.50")
    assert job.requirements["min_reliability"] == 0.98
