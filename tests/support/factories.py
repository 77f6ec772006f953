from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from jobs.models import Job
from nomadgpu.models import Membership, Role, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests-only")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    role = Role.MEMBER


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"finetune-{n}")
    image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
    command = "python train.py"


def make_attempt(job=None, *, number: int = 1, state: str = "starting", **fields):
    """An attempt with a fresh agent token; returns (attempt, token)."""
    from jobs.models import Attempt
    from nomadgpu.tokens import issue_token

    issued = issue_token()
    job = job or JobFactory()
    if state in ("starting", "running") and job.state == "queued":
        job.state = state  # the job follows its live attempt
        job.save(update_fields=["state"])
    attempt = Attempt.objects.create(
        job=job,
        number=number,
        state=state,
        token_prefix=issued.prefix,
        token_digest=issued.digest,
        **fields,
    )
    return attempt, issued.token
