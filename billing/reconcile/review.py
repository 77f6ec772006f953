"""A flag closed: by a person who reviewed it, or because the numbers agree again."""

from __future__ import annotations

from datetime import datetime

from billing.models import DiscrepancyFlag, FlagStatus


def close_open_flags(flags, *, note: str, now: datetime) -> int:
    """Close FLAGS that are still open because the numbers now agree (no reviewer)."""
    return flags.filter(status=FlagStatus.OPEN).update(
        status=FlagStatus.REVIEWED, note=note, reviewed_at=now, updated_at=now
    )


def mark_reviewed(flag: DiscrepancyFlag, *, user, note: str, now: datetime) -> bool:
    """Mark FLAG reviewed with NOTE; False if someone else reviewed it first."""
    return bool(
        DiscrepancyFlag.objects.filter(pk=flag.pk, status=FlagStatus.OPEN).update(
            status=FlagStatus.REVIEWED, note=note, reviewed_by=user, reviewed_at=now
        )
    )
