"""The provider poll: one paged list call per Vast account, read against the live attempts.

Each attempt is its own unit: a create to adopt or settle (``adopt``), its host's loss
(``instance_status``), an offline host waited for (``offline``), an outbid answered
(``outbids``), a hedged rent's racers (``races``); what the provider last said is kept on the
attempt. Then the account's orphans (our labelled instances no live attempt owns) are
destroyed after a grace, and a racer's out of its race at once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from hosts.vast import Instance, VastClient, VastError, image_pull_seen
from jobs import attention
from jobs.lifecycle import Loss
from jobs.models import ON_HOST_STATES, Attempt, AttemptState, parse_label
from jobs.watchdog import races, start_due
from jobs.watchdog.adopt import adopt_or_close
from jobs.watchdog.instance_status import OFFLINE, contract_end, provider_loss
from jobs.watchdog.offline import note_host_back, offline_loss_unless_waiting
from jobs.watchdog.outbids import raise_bid_if_it_pays
from nomadgpu.models import ServiceHeartbeat, Team

logger = logging.getLogger(__name__)


def poll_providers(now: datetime) -> list[Loss]:
    """One paged list call per account: provider-confirmed losses, adoptions, orphans. An
    account that cannot be polled (its key no longer opens, Vast refuses it) is a
    supervisor-health line; the other accounts are polled all the same."""
    found: list[Loss] = []
    errors: list[str] = []
    for (url, key), attempts in attempts_by_account(errors).items():
        try:
            with VastClient(key, url) as client:
                instances = client.list_instances()
                # When the answer came, not the tick's start: a first `running` read is when
                # billing.spend starts the GPU, and it must not come before the switch.
                read_at = timezone.now()
                found += reconcile_account(client, attempts, instances, now, read_at=read_at)
        except VastError as exc:
            logger.warning("provider poll of %s failed: %s", url, exc)
            errors.append(f"{url}: {exc}")
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            logger.exception("provider poll of %s failed", url)
            errors.append(f"{url}: {attention.describe(exc)}")
            attention.account_failed(url, attention.describe(exc))
    # The status page's "provider reachable" (it shows only ok and the time, never the error).
    ServiceHeartbeat.objects.update_or_create(
        name="provider",
        defaults={
            "last_seen_at": now,
            "detail": {"ok": not errors, "error": "; ".join(errors)[:500]},
        },
    )
    return found


def attempts_by_account(errors: list[str]) -> dict[tuple[str, str], list[Attempt]]:
    """The live attempts grouped by the provider account they rent on; a team whose account
    cannot be read (a Vast key sealed under a key no longer configured) is left out, and
    said so in ERRORS once per team."""
    # The teams' secrets are opened one team at a time, inside its own try: one that does not
    # open (it is decrypted as its row loads) must not fail the query for every team.
    secrets = [f"job__team__{name}" for name in Team.SECRET_FIELDS]
    live = Attempt.objects.live().select_related("job__team").defer(*secrets)
    by_team: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in live:
        by_team[attempt.job.team_id].append(attempt)
    by_account: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    by_account[account_of(None)] = []  # orphans are looked for on the server's account
    for attempts in by_team.values():
        team = attempts[0].job.team
        try:
            account = account_of(team)
        except Exception as exc:
            why = f"team {team.slug}: its Vast account cannot be used ({attention.describe(exc)})"
            logger.error("provider poll: %s", why)
            errors.append(why)
            attention.account_failed(f"team {team.slug}", why)
            continue
        by_account[account].extend(attempts)
    return by_account


def account_of(team) -> tuple[str, str]:
    url = (team.vast_url if team and team.vast_url else settings.VAST_URL).rstrip("/")
    key = team.vast_api_key if team and team.vast_api_key else settings.VAST_API_KEY
    return url, key


def reconcile_account(
    client: VastClient,
    attempts: list[Attempt],
    instances: list[Instance],
    now: datetime,
    *,
    read_at: datetime | None = None,
) -> list[Loss]:
    """What one account's instance list (answered at READ_AT, default NOW) says of its live
    attempts (each attempt its own unit: its error stays with its job), then its orphans
    reaped."""
    by_id = {instance.id: instance for instance in instances}
    by_label = {instance.label: instance for instance in instances if instance.label}
    found: list[Loss] = []
    for attempt in attempts:
        what = "read what the provider says of its host"
        with attention.row(job_id=attempt.job_id, what=what, now=now):
            loss = reconcile_attempt(
                client, attempt, by_id, by_label, now=now, read_at=read_at or now
            )
            if loss is not None:
                found.append(loss)
    owned = {a.instance_id for a in attempts if a.instance_id} | {a.label for a in attempts}
    owned |= races.owned_by_races(attempts)
    owned |= races.sweep_racers(client, instances, owned, now=now)
    reap_orphans(client, instances, owned, now)
    return found


def reconcile_attempt(
    client: VastClient,
    attempt: Attempt,
    by_id: dict,
    by_label: dict,
    *,
    now: datetime,
    read_at: datetime | None = None,
) -> Loss | None:
    """ATTEMPT against the provider's view (read at READ_AT, default NOW): a create to adopt
    or settle, or its host's loss."""
    if attempt.state == AttemptState.REQUESTED:
        if attempt.raced:  # a hedged rent: its racers' creates (jobs.watchdog.races)
            races.settle_requested(attempt, by_label, now=now)
        else:
            adopt_or_close(attempt, by_label.get(attempt.label), now)
        return None
    if attempt.state in ON_HOST_STATES and races.is_racing(attempt):
        return races.follow_race(attempt, by_id, by_label, now=now)
    if attempt.state not in ON_HOST_STATES or attempt.instance_id is None:
        return None
    instance = by_id.get(attempt.instance_id)
    loss = provider_loss(attempt, instance)
    note_provider_status(attempt, instance, now=read_at or now)
    if loss is not None and loss.cause == OFFLINE:
        return offline_loss_unless_waiting(attempt, loss, now=now)
    if attempt.offline_since is not None and instance is not None:
        note_host_back(attempt, now=now)
    outbid = loss is not None and loss.cause == "outbid"
    if outbid and raise_bid_if_it_pays(client, attempt, instance, now=now):
        return None
    return loss


def note_provider_status(attempt: Attempt, instance: Instance | None, *, now: datetime) -> None:
    """Keep what the provider said of ATTEMPT's instance in the answer read at NOW: its status,
    how many polls in a row it was ``unknown``, its message (the start timeout quotes it), and
    the moments the poll first read it ``loading`` and ``running`` (``first_reads``: what
    ``billing.spend`` records GPU time from, and ``billing.image_pull`` reads a pull from), and
    what Docker's words said of its image while it loaded (``pull_seen``). Before the agent, a
    new status or a pull moving pushes the host's start deadline (``start_due``)."""
    status = instance.actual_status if instance else "gone"
    msg = ((instance.status_msg or "") if instance else "")[:500]
    start_due.note_provider_news(attempt, status or "", msg, now=now)
    unknown = F("provider_unknown_polls") + 1 if status == "unknown" else 0
    Attempt.objects.filter(pk=attempt.pk).update(
        provider_status=status or "",
        provider_unknown_polls=unknown,
        provider_status_msg=msg,
        contract_ends_at=contract_end(instance),
        **first_reads(status, now),
        **pull_seen(attempt, instance),
    )


# The statuses whose first read is kept, and where: Vast bills the GPU from ``running`` and
# pulls the image in ``loading`` (docs/vast-api.md §4 and §7).
FIRST_READ_FIELDS = {"loading": "provider_loading_at", "running": "provider_running_at"}


def pull_seen(attempt: Attempt, instance: Instance | None) -> dict:
    """What Docker's words in a loading INSTANCE's message say of its image
    (``hosts.vast.image_pull_seen``), kept from the first poll that read them."""
    if attempt.provider_pull_seen or instance is None or instance.actual_status != "loading":
        return {}
    seen = image_pull_seen(instance.status_msg)
    return {"provider_pull_seen": seen} if seen else {}


def first_reads(status: str | None, now: datetime) -> dict:
    """UPDATE expressions keeping NOW as the first read of STATUS, unless one is kept already."""
    field = FIRST_READ_FIELDS.get(status or "")
    if field is None:
        return {}
    return {field: Coalesce(F(field), Value(now, output_field=DateTimeField()))}


def reap_orphans(client: VastClient, instances: list[Instance], owned: set, now: datetime) -> None:
    """Destroy our labelled instances that no live attempt owns, after a grace period."""
    orphan_grace = timedelta(seconds=settings.ORPHAN_GRACE_S)
    for instance in instances:
        if parse_label(instance.label) is None:
            continue  # not ours (or another environment's): never touched
        if instance.id in owned or instance.label in owned:
            continue
        started = instance.start_date
        if started is not None and now - started < orphan_grace:
            continue
        logger.warning("destroying orphan instance %s (%s)", instance.id, instance.label)
        try:
            client.destroy_instance(instance.id)
        except VastError as exc:
            logger.warning("could not destroy orphan %s: %s", instance.id, exc)
