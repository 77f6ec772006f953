"""factory-boy factories for the rows tests build, one per model.

Defaults make a valid row and nothing more: a test passes every field its assertions depend on.
A row that hangs off an attempt (a checkpoint, an interruption) takes the attempt's job."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from billing.models import Charge, ChargeItem, InvoiceSync, TeamBudget
from hosts.models import Machine
from jobs.models import (
    Attempt,
    Checkpoint,
    Interruption,
    Job,
    JobEvent,
    LossPoint,
    StagedObject,
    WorkdirPack,
)
from nomadgpu.models import IngestOutage, Membership, Role, ServiceHeartbeat, Team, TeamSecret
from notify.models import Channel

# --- people and teams ---------------------------------------------------------------------


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


class TeamSecretFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TeamSecret

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"SECRET_{n}")
    value = "not-a-real-secret"


# --- jobs and what happens to them -----------------------------------------------------------


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"finetune-{n}")
    image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
    command = "python train.py"
    # One instance per rent, as every test written before hedged rents expects; a test of
    # racing asks for it (race="auto" or a number). JobSpec's default is "auto".
    race = "off"


class AttemptFactory(factory.django.DjangoModelFactory):
    """An attempt without an agent token; ``make_attempt`` gives it one."""

    class Meta:
        model = Attempt

    job = factory.SubFactory(JobFactory)
    number = 1
    state = "starting"


def make_attempt(job=None, *, number: int = 1, state: str = "starting", **fields):
    """An attempt with a fresh agent token; returns (attempt, token)."""
    from nomadgpu.tokens import issue_token

    issued = issue_token()
    job = job or JobFactory()
    if state in ("starting", "running") and job.state == "queued":
        job.state = state  # the job follows its live attempt
        job.save(update_fields=["state"])
    attempt = AttemptFactory(
        job=job,
        number=number,
        state=state,
        token_prefix=issued.prefix,
        token_digest=issued.digest,
        **fields,
    )
    return attempt, issued.token


class CheckpointFactory(factory.django.DjangoModelFactory):
    """A checkpoint of an attempt, uploading (the model's default) unless told ``state``."""

    class Meta:
        model = Checkpoint

    attempt = factory.SubFactory(AttemptFactory, state="running")
    job = factory.LazyAttribute(lambda o: o.attempt.job)
    step = 100
    key = factory.LazyAttribute(lambda o: f"k/{o.step}")
    size = 1


class InterruptionFactory(factory.django.DjangoModelFactory):
    """A host lost under a job: its attempt, ended, and when the loss was detected."""

    class Meta:
        model = Interruption

    attempt = factory.SubFactory(AttemptFactory, state="ended")
    job = factory.LazyAttribute(lambda o: o.attempt.job)
    cause = "provider_gone"
    detected_at = factory.LazyFunction(timezone.now)


class JobEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobEvent

    job = factory.SubFactory(JobFactory)
    kind = "submitted"


class LossPointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = LossPoint

    job = factory.SubFactory(JobFactory)
    step = factory.Sequence(lambda n: n * 10)
    loss = 1.0


class WorkdirPackFactory(factory.django.DjangoModelFactory):
    """A team's code pack, still uploading (the model's default) unless told ``state``."""

    class Meta:
        model = WorkdirPack

    team = factory.SubFactory(TeamFactory)
    sha256 = factory.Sequence(lambda n: f"{n:064x}")
    size = 1


class StagedObjectFactory(factory.django.DjangoModelFactory):
    """A stage entry being mirrored into a team's storage (the model's default state)."""

    class Meta:
        model = StagedObject

    team = factory.SubFactory(TeamFactory)
    kind = "hf"
    source = factory.Sequence(lambda n: f"hf:org/model-{n}@main:*")


# --- hosts ---------------------------------------------------------------------------------


class MachineFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Machine

    machine_id = factory.Sequence(lambda n: 30_000 + n)
    gpu_name = "RTX 4090"


# --- money ---------------------------------------------------------------------------------


class TeamBudgetFactory(factory.django.DjangoModelFactory):
    """A team's spending limits; none set unless told."""

    class Meta:
        model = TeamBudget

    team = factory.SubFactory(TeamFactory)


class InvoiceSyncFactory(factory.django.DjangoModelFactory):
    """Where a team's invoice import stands; it has never run unless told."""

    class Meta:
        model = InvoiceSync

    team = factory.SubFactory(TeamFactory)


class ChargeFactory(factory.django.DjangoModelFactory):
    """One day's charge of an instance as Vast's API keys it: start and end at 00:00 UTC."""

    class Meta:
        model = Charge

    team = factory.SubFactory(TeamFactory)
    instance_id = factory.Sequence(lambda n: 101 + n)
    source = factory.LazyAttribute(lambda o: f"instance-{o.instance_id}")
    day = date(2026, 3, 1)
    start = factory.LazyAttribute(lambda o: datetime.combine(o.day, datetime.min.time(), UTC))
    end = factory.LazyAttribute(lambda o: o.start)
    amount = Decimal("0")
    origin = "api"


class ChargeItemFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ChargeItem

    charge = factory.SubFactory(ChargeFactory)
    position = 0
    type = "gpu"
    amount = Decimal("0")


# --- the supervisor's own rows -------------------------------------------------------------


class ServiceHeartbeatFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ServiceHeartbeat

    name = "watchdog"
    last_seen_at = factory.LazyFunction(timezone.now)


class IngestOutageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IngestOutage

    cause = IngestOutage.WEB_DOWN
    started_at = factory.LazyFunction(timezone.now)


# --- notifications -------------------------------------------------------------------------


class ChannelFactory(factory.django.DjangoModelFactory):
    """A team's notification channel: a webhook unless told ``kind="telegram"`` (with its
    ``chat_id`` and ``telegram_bot_token``)."""

    class Meta:
        model = Channel

    team = factory.SubFactory(TeamFactory)
    kind = "webhook"
    name = factory.Sequence(lambda n: f"channel {n}")
    webhook_url = factory.LazyAttribute(
        lambda o: "https://hooks.example.com/nomadgpu" if o.kind == "webhook" else ""
    )
