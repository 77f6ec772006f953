"""When each phase began on the host: the boundaries an agent reports (at register, then on
heartbeats until one is answered), each kept on the attempt at its first report.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from jobs.models import ON_HOST_STATES, Attempt

# The phase boundaries an agent may report (PROTOCOL.md, ``phases``) and the Attempt field
# each is kept in. A report older than PHASE_AGE_LIMIT_S is dropped as nonsense.
PHASE_FIELDS = {
    "container_started": "container_started_at",
    "deps_ready": "deps_ready_at",
    "workdir_ready": "workdir_ready_at",
    "setup_done": "setup_done_at",
    "stage_done": "stage_done_at",
    "restore_downloaded": "restore_downloaded_at",
    "restore_unpacked": "restore_unpacked_at",
    "command_started": "command_started_at",
    "first_step": "first_step_at",
}
PHASE_AGE_LIMIT_S = 7 * 86400


def record_phases(attempt_id: int, ages: dict[str, float], *, now: datetime) -> None:
    """Keep the phase boundaries AGES reports (seconds before NOW, by name) on the attempt;
    a boundary already known keeps its first report (an agent resends until answered, and a
    restarted agent's repeats must not move it)."""
    fields = first_reports(ages, now)
    if fields:
        Attempt.objects.filter(pk=attempt_id, state__in=ON_HOST_STATES).update(**fields)


def first_reports(ages: dict[str, float], now: datetime) -> dict:
    """UPDATE expressions that set each named boundary to NOW - age unless already set."""
    return {
        PHASE_FIELDS[name]: Coalesce(
            F(PHASE_FIELDS[name]),
            Value(now - timedelta(seconds=age), output_field=DateTimeField()),
        )
        for name, age in ages.items()
        if name in PHASE_FIELDS
    }
