"""Flags and events: one ``DiscrepancyFlag`` per flagged attempt and per unmatched charge,
one ``invoice_discrepancy`` event when an attempt's flag is first created."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from billing.cost import covered_until
from billing.models import Charge, DiscrepancyFlag
from billing.reconcile.attempt import AttemptReconciliation, charges_prefetch, reconcile_attempt
from billing.reconcile.period_flags import PeriodScope, flag_periods
from billing.reconcile.review import close_open_flags
from billing.reconcile.tolerance import Status, Tolerance
from jobs.models import Attempt, JobEvent
from nomadgpu.humanize import money


def flag_discrepancies(team, *, now: datetime, tolerance: Tolerance | None = None) -> int:
    """Keep one ``DiscrepancyFlag`` per flagged attempt, per unmatched charge and per UTC day
    and month whose matched attempts add up outside the tolerance (``flag_periods``), and write
    an ``invoice_discrepancy`` event when an attempt's flag is first created (never again).
    Returns how many flags were created. Unmatched charges and periods have no job, so no job
    event: finance sees them in the period summary."""
    tolerance = tolerance or Tolerance.from_settings()
    covered = covered_until(team)
    since = now - timedelta(days=settings.INVOICE_LOOKBACK_DAYS)
    attempts = (
        Attempt.objects.filter(job__team=team, rented_at__isnull=False, ended_at__gte=since)
        .select_related("job")
        .prefetch_related(charges_prefetch())
    )
    created, rows = 0, []
    for attempt in attempts:
        row = reconcile_attempt(attempt, now=now, tolerance=tolerance, covered=covered)
        rows.append(row)
        if row.flagged:
            created += _flag_attempt(team, row, now=now)
        elif row.status == Status.MATCHED:
            close_open_flags(
                DiscrepancyFlag.objects.filter(attempt=attempt),
                note="matches the invoice after a later import",
                now=now,
            )
    close_open_flags(
        DiscrepancyFlag.objects.filter(team=team, charge__attempt__isnull=False),
        note="the charge was matched to an attempt after a later import",
        now=now,
    )
    for charge in Charge.objects.filter(team=team, attempt__isnull=True, day__gte=since.date()):
        _, new = DiscrepancyFlag.objects.get_or_create(
            charge=charge,
            defaults={
                "team": team,
                "kind": Status.UNMATCHED_CHARGE,
                "billed_usd": charge.amount,
                "reason": f"no NomadGPU attempt for {charge.source}",
                "created_at": now,
                "updated_at": now,
            },
        )
        created += new
    scope = PeriodScope(team, now=now, since=since, tolerance=tolerance, covered=covered)
    return created + flag_periods(scope, rows)


def _flag_attempt(team, row: AttemptReconciliation, *, now: datetime) -> int:
    attempt = row.attempt
    numbers = {
        "kind": row.status,
        "recorded_usd": Decimal(f"{row.recorded:.4f}"),
        "billed_usd": Decimal(f"{row.billed:.4f}"),
        "reason": row.reason[:300],
        "updated_at": now,
    }
    with transaction.atomic():
        flag, new = DiscrepancyFlag.objects.get_or_create(
            attempt=attempt, defaults={"team": team, "created_at": now, **numbers}
        )
        if not new:
            DiscrepancyFlag.objects.filter(pk=flag.pk).update(**numbers)
            return 0
        JobEvent.objects.record(
            attempt.job_id,
            now=now,
            kind="invoice_discrepancy",
            message=(
                f"Attempt #{attempt.number}: Vast billed {money(row.billed)}, NomadGPU recorded "
                f"{money(row.recorded)} ({Status.LABELS[row.status]}). {row.reason}"
            ),
            data={
                "attempt": attempt.number,
                "instance_id": attempt.instance_id,
                "status": row.status,
                "billed_usd": round(row.billed, 4),
                "recorded_usd": round(row.recorded, 4),
                "difference_usd": round(row.diff, 4),
                "reason": row.reason,
            },
        )
    return 1
